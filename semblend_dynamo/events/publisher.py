"""Evidence publishing that never blocks routing: a bounded queue drained by one background task.

:meth:`EvidencePublisher.offer` is synchronous and O(1); when the queue is full the message is
dropped and counted. While NATS is down the drainer waits; queued evidence goes out on reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections import Counter
from collections.abc import Callable

from .codec import encode
from .link import NatsLink
from .schemas import SemblendEvent

log = logging.getLogger(__name__)


class EvidencePublisher:
    """Enveloped, sequenced publishing of SemBlend events on one link."""

    def __init__(
        self,
        link: NatsLink,
        *,
        queue_size: int,
        on_sent: Callable[[str], None] | None = None,
        on_dropped: Callable[[str, str], None] | None = None,
    ) -> None:
        self._link = link
        self._queue: asyncio.Queue[tuple[str, SemblendEvent]] = asyncio.Queue(maxsize=queue_size)
        self.publisher_id = random.getrandbits(63) ^ os.getpid()
        self._sequence = 0
        self._task: asyncio.Task[None] | None = None
        self._on_sent = on_sent
        self._on_dropped = on_dropped
        self.sent: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._drain())

    def offer(self, subject: str, event: SemblendEvent) -> bool:
        """Queue one event for ``subject``; False (and a counted drop) when the queue is full."""
        try:
            self._queue.put_nowait((subject, event))
        except asyncio.QueueFull:
            self._drop(event.KIND, "queue_full")
            return False
        return True

    async def send_first(self, subject: str, event: SemblendEvent, timeout: float) -> bool:
        """Publish ``event`` ahead of the queue and wait (at most ``timeout`` s) until it is written to the NATS
        server's connection, without waiting for a server round trip.

        For a message that must leave before something sent another way (a hint before its request). If it cannot
        be sent now it is queued as :meth:`offer` would (False), so it is never lost for being urgent.
        """
        data = self.encode(event)
        written = await self._link.publish_written(subject, data, timeout)  # nothing queued ahead: in one step
        if not written:
            try:
                await self._link.publish(subject, data)
            except Exception as exc:
                log.debug("urgent publish failed (%s); queued", exc)
                self.offer(subject, event)
                return False
        self.sent[event.KIND] += 1
        if self._on_sent is not None:
            self._on_sent(event.KIND)
        if written:
            return True
        try:
            await self._link.write_out(timeout)
        except Exception as exc:  # in the client's buffer already: it follows as soon as it can
            log.debug("writing an urgent publish out did not complete: %s", exc)
        return True

    @property
    def backlog(self) -> int:
        return self._queue.qsize()

    async def flush(self, timeout: float) -> bool:
        """Wait until the queue is empty (tests, shutdown)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._queue.qsize() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        return not self._queue.qsize()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def encode(self, event: SemblendEvent) -> bytes:
        """The next enveloped message of this publisher (also used for direct replies)."""
        data = encode(event, publisher_id=self.publisher_id, sequence=self._sequence)
        self._sequence += 1
        return data

    async def _drain(self) -> None:
        while True:
            subject, event = await self._queue.get()
            await self._link.wait_connected()
            try:
                await self._link.publish(subject, self.encode(event))
            except Exception as exc:
                self._drop(event.KIND, "publish_error")
                log.debug("evidence publish failed: %s", exc)
                continue
            self.sent[event.KIND] += 1
            if self._on_sent is not None:
                self._on_sent(event.KIND)

    def _drop(self, kind: str, reason: str) -> None:
        self.dropped[reason] += 1
        if self._on_dropped is not None:
            self._on_dropped(kind, reason)
