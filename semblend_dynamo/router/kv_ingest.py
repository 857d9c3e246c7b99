"""Dynamo's ``kv-events`` into the router's residency, over whichever event plane the runtime is configured with.

Dynamo's event plane is ``DYN_EVENT_PLANE`` (``zmq`` by default, ``nats`` opt-in); workers and the router's own
``KvRouter`` follow it. The router reads the same events either way:

- ``nats``: a live subscription to the workers' ``...kv-events`` subject on the router's NATS link (the same
  messages Dynamo's ``KvRouter`` receives), plus Dynamo's recovered index after a reconnect or an event-id gap.
- ``zmq``: each worker binds its own ZMQ PUB socket and advertises it through Dynamo's discovery (etcd,
  Kubernetes or file). The Python runtime exposes no kv-events subscriber (1.6.1 has one for forward-pass
  metrics only), but the router's ``KvRouter`` already subscribes to every publisher discovery names, with
  Dynamo's own transport, recovery and worker tracking. :class:`KvIndexFollower` reads that index
  (``KvRouter.dump_events()``) every ``kv_index_poll_s`` and reconciles residency with it: a block missing from
  the index has been removed, or its worker left. No hand-made sockets, nothing to configure beyond Dynamo's own
  settings. A read costs time proportional to the blocks indexed (benchmarks/bench_kv_index_read.py); the
  follower parses off the event loop and stretches its interval so reads take at most a third of the time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from ..config import ConfigError
from ..events.codec import RejectedMessage, kv_events_from_dump
from ..events.schemas import KvEvent

log = logging.getLogger(__name__)

EVENT_PLANES = ("zmq", "nats")
DEFAULT_EVENT_PLANE = "zmq"
"""Dynamo 1.6's default (``DYN_EVENT_PLANE`` unset)."""


def configured_event_plane(env: Mapping[str, str]) -> str:
    """The event plane Dynamo's runtime uses for this environment; :class:`ConfigError` names a bad value."""
    plane = env.get("DYN_EVENT_PLANE", "").strip().lower() or DEFAULT_EVENT_PLANE
    if plane not in EVENT_PLANES:
        raise ConfigError(f"DYN_EVENT_PLANE={env['DYN_EVENT_PLANE']!r}: expected one of {', '.join(EVENT_PLANES)}")
    return plane


class KvIndexSource(Protocol):
    """The part of ``dynamo.llm.KvRouter`` the follower reads."""

    async def dump_events(self) -> str: ...


class KvIndexFollower:
    """Reads Dynamo's KV index (fed by the runtime's own event-plane subscription) and hands it to ``on_index``.

    ``on_index`` receives the full index as :class:`KvEvent` s (stored blocks) after every read; ``on_error``
    counts a read or a dump that could not be used (the previous residency is kept).
    """

    def __init__(
        self,
        kv_router: KvIndexSource,
        on_index: Callable[[list[KvEvent]], None],
        *,
        interval_s: float,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._kv_router = kv_router
        self._on_index = on_index
        self._interval_s = interval_s
        self._on_error = on_error
        self._task: asyncio.Task[None] | None = None
        self.reads = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def read_once(self) -> bool:
        """One read of the index (parsed off the event loop); False when it could not be used."""
        try:
            events = await asyncio.to_thread(kv_events_from_dump, await self._kv_router.dump_events())
        except RejectedMessage as exc:
            self._error(exc.reason)
            return False
        except Exception as exc:
            log.debug("KV index read failed: %s", exc)
            self._error("read_error")
            return False
        self.reads += 1
        self._on_index(events)
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.read_once()
            # a large index: read at most a third of the time, so the request path keeps the loop
            await asyncio.sleep(max(self._interval_s, 2 * (loop.time() - started)))

    def _error(self, reason: str) -> None:
        if self._on_error is not None:
            self._on_error(reason)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
