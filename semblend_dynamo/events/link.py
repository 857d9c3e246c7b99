"""One nats-py connection that survives NATS being down at start and going away mid-run.

:meth:`NatsLink.start` never raises: it keeps trying to connect in the background, and nats-py
reconnects on its own after a loss (subscriptions are restored by nats-py; subscriptions made while
no connection existed are made on the first connect). ``connected`` drives health and tells
publishers when to send.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.protocol.command import pub_cmd

from ..config import SemblendConfig

log = logging.getLogger(__name__)

MessageHandler = Callable[[Msg], Awaitable[None]]
_PLAIN_SUBJECT = re.compile(r"[^.\s*>]+(\.[^.\s*>]+)*")
"""A subject nats-py accepts for a publish (tokens without spaces, wildcards or empty parts)."""
_SUBJECTS_CHECKED = 4096
"""Subjects whose check is remembered (a router publishes hints on one subject a worker): a hit skips the regex."""


@functools.lru_cache(maxsize=_SUBJECTS_CHECKED)
def _plain_subject(subject: str) -> bool:
    return _PLAIN_SUBJECT.fullmatch(subject) is not None


class NatsLink:
    """Owns the component's NATS client; safe to use before (and while not) connected."""

    def __init__(self, cfg: SemblendConfig, *, name: str, retry_s: float = 0.5) -> None:
        self._cfg = cfg
        self._name = name
        self._retry_s = retry_s
        self._nc: NatsClient | None = None
        self._subs: list[tuple[str, MessageHandler]] = []
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Future[None]] = set()
        self._up = asyncio.Event()
        self.on_reconnect: list[Callable[[], Awaitable[None]]] = []

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def wait_connected(self) -> None:
        """Return once the link is (again) connected."""
        while not self.connected:
            self._up.clear()
            await self._up.wait()

    def start(self) -> None:
        """Called once from the running loop; connects in the background."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._connect_forever())

    def subscribe(self, subject: str, handler: MessageHandler) -> None:
        """Register a subscription; it is made now if connected, otherwise on the first connect."""
        self._subs.append((subject, handler))
        if self.connected:
            task = asyncio.ensure_future(self._subscribe_one(subject, handler))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def publish(self, subject: str, data: bytes, *, reply: str = "") -> None:
        """Publish; raises ConnectionError when there is no connection (callers count a drop)."""
        if not self.connected or self._nc is None:
            raise ConnectionError("NATS is not connected")
        await self._nc.publish(subject, data, reply=reply)

    async def publish_written(self, subject: str, data: bytes, timeout: float) -> bool:
        """Publish ``data`` by handing its PUB to the server's connection here, as nats-py's flusher task would, when
        nothing is queued ahead of it (nats-py's buffer and the socket's both empty), then wait (at most ``timeout`` s)
        for the socket to take whatever the kernel did not take at once (nothing, usually: no event-loop turn). True
        once handed over; False, with nothing done, otherwise (a backlog, a reconnect, a nats-py or transport without
        these internals, a closed or draining client, a subject or size nats-py would refuse): :meth:`publish`, then
        :meth:`write_out`.

        Skips what nats-py's ``publish`` adds for a buffered write: a future put on its flusher task's queue, and that
        task's later loop turn finding nothing left to write. Pinned by ``tests/router/test_events.py``.
        """
        nc = self._nc
        writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
        if nc is None or writer is None or not nc.is_connected or nc.is_draining_pubs:
            return False
        if getattr(nc, "_pending", None) != [] or len(data) > nc._max_payload:
            return False
        if not (getattr(nc, "_skip_subject_validation", False) or _plain_subject(subject)):
            return False  # nats-py checks it (and raises)
        transport = writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        nc.stats["out_msgs"] += 1
        nc.stats["out_bytes"] += len(data)
        writer.write(pub_cmd(subject, "", data))
        if transport.get_write_buffer_size():  # the rest follows as the socket allows
            try:
                await asyncio.wait_for(writer.drain(), timeout)
            except Exception as exc:
                log.debug("an urgent publish was not written out in time: %s", exc)
        return True

    async def write_out(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until everything published so far is written to the server's connection, with
        no server round trip; raises on no connection/timeout.

        nats-py buffers a publish for its flusher task. When the socket takes the buffer at once (the usual case),
        this writes it here, as that task would, without giving the event loop a turn (:meth:`_write_now`);
        otherwise it waits for that task to write and drain the buffer (its ``_flush_pending(force_flush=True)``),
        and falls back to :meth:`flush` on a nats-py without it. Both pinned by ``tests/router/test_events.py``.
        """
        if not self.connected or self._nc is None:
            raise ConnectionError("NATS is not connected")
        if self._write_now():
            return
        write = getattr(self._nc, "_flush_pending", None)
        if write is None:
            await self.flush(timeout)
            return
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(write(force_flush=True))), timeout)

    def _write_now(self) -> bool:
        """Hand nats-py's buffered commands to the socket now, as its flusher task does (which then finds nothing to
        write); True when the kernel took all of it. False (nothing done) on a nats-py or transport without these
        internals or while it is reconnecting (its buffer is then replayed on reconnect)."""
        nc = self._nc
        writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
        pending = getattr(nc, "_pending", None)
        if nc is None or writer is None or not isinstance(pending, list) or not nc.is_connected:
            return False
        transport = writer.transport
        if transport.is_closing() or transport.get_write_buffer_size():
            return False  # the socket is behind already: the flusher task writes in order
        if pending:
            writer.writelines(pending)
            nc._pending = []
            nc._pending_data_size = 0
        return not transport.get_write_buffer_size()

    async def flush(self, timeout: float) -> None:
        """Wait until the server has everything published so far (one round trip); raises on no connection/timeout."""
        if not self.connected or self._nc is None:
            raise ConnectionError("NATS is not connected")
        # nats-py's own flush is never cancelled here (a PONG that arrives for a cancelled PING upsets its reader):
        # only this wait is bounded, and the flush goes on in the background (bounded by nats-py, 10 s).
        ping = asyncio.ensure_future(self._nc.flush())
        ping.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.wait_for(asyncio.shield(ping), timeout)

    @property
    def max_payload(self) -> int | None:
        """The largest message the server takes (its ``max_payload``), None while not connected."""
        return self._nc.max_payload if self.connected and self._nc is not None else None

    def new_inbox(self) -> str:
        if self._nc is None:
            raise ConnectionError("NATS is not connected")
        return self._nc.new_inbox()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    def _options(self) -> dict[str, Any]:
        cfg = self._cfg
        options: dict[str, Any] = {
            "servers": [cfg.nats_url],
            "name": self._name,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": self._retry_s,
            "connect_timeout": 1,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "error_cb": self._on_error,
        }
        if cfg.nats_user:
            options["user"] = cfg.nats_user
            options["password"] = cfg.nats_password or ""
        if cfg.nats_token:
            options["token"] = cfg.nats_token
        if cfg.nats_creds_file:
            options["user_credentials"] = cfg.nats_creds_file
        return options

    async def _connect_forever(self) -> None:
        attempt = 0
        while True:
            try:
                self._nc = await nats.connect(**self._options())
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                attempt += 1
                if attempt == 1 or attempt % 20 == 0:
                    log.warning(
                        "NATS at SEMBLEND_NATS_URL=%s not reachable (%s); retrying",
                        self._cfg.nats_url,
                        type(exc).__name__,
                    )
                await asyncio.sleep(self._retry_s)
        log.info("NATS connected to %s", self._cfg.nats_url)
        for subject, handler in self._subs:
            await self._subscribe_one(subject, handler)
        self._up.set()
        await self._run_callbacks()

    async def _subscribe_one(self, subject: str, handler: MessageHandler) -> None:
        if self._nc is not None:
            await self._nc.subscribe(subject, cb=handler, pending_msgs_limit=1 << 20, pending_bytes_limit=1 << 30)

    async def _on_disconnected(self) -> None:
        log.warning("NATS disconnected; routing continues exact-only until it is back")

    async def _on_reconnected(self) -> None:
        log.info("NATS reconnected")
        self._up.set()
        await self._run_callbacks()

    async def _run_callbacks(self) -> None:
        for callback in self.on_reconnect:
            try:
                await callback()
            except Exception:
                log.exception("reconnect callback failed")

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS client error: %s", exc)
