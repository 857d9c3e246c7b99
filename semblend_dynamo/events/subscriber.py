"""Decoding subscriptions: every message on a subscribed subject is either handled or counted as rejected.

Handlers are plain callables run on the event loop. A handler that raises is counted
(``handler_error``) and logged; the subscription keeps going.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from .codec import RejectedMessage, decode, decode_kv_events
from .link import NatsLink
from .schemas import KvEventBatch, SemblendEvent

log = logging.getLogger(__name__)

Counted = Callable[[str], None]
CountedWithReason = Callable[[str, str], None]


class EventSubscriber:
    """Subscribes decoders on a :class:`NatsLink` and counts what arrives, per stream and reason."""

    def __init__(
        self,
        link: NatsLink,
        *,
        max_bytes: int,
        deployment: str | None,
        on_received: Counted | None = None,
        on_rejected: CountedWithReason | None = None,
    ) -> None:
        self._link = link
        self._max_bytes = max_bytes
        self._deployment = deployment
        self._on_received = on_received
        self._on_rejected = on_rejected
        self.received: Counter[str] = Counter()
        self.rejected: Counter[tuple[str, str]] = Counter()

    def kv_events(self, subject: str, handler: Callable[[KvEventBatch], None], *, stream: str = "kv_events") -> None:
        """Dynamo kv-events on ``subject`` -> ``handler(batch)``."""

        async def on_message(msg: Msg) -> None:
            try:
                batch = decode_kv_events(msg.data, max_bytes=self._max_bytes)
            except RejectedMessage as exc:
                self._reject(stream, exc.reason)
                return
            self._handle(stream, handler, batch)

        self._link.subscribe(subject, on_message)

    def semblend(
        self,
        subject: str,
        expected: tuple[type[SemblendEvent], ...],
        handler: Callable[[SemblendEvent, Msg], Awaitable[None] | None],
        *,
        stream: str,
    ) -> None:
        """SemBlend events of the ``expected`` models on ``subject`` -> ``handler(event, msg)``."""

        async def on_message(msg: Msg) -> None:
            try:
                event = decode(msg.data, expected, max_bytes=self._max_bytes, deployment=self._deployment)
            except RejectedMessage as exc:
                self._reject(stream, exc.reason)
                return
            result = self._handle(stream, handler, event, msg)
            if result is not None:
                try:
                    await result
                except Exception:
                    self._reject(stream, "handler_error")
                    log.exception("handler for %s failed", stream)

        self._link.subscribe(subject, on_message)

    def _handle(self, stream: str, handler: Callable[..., object], *args: object) -> Awaitable[None] | None:
        self.received[stream] += 1
        if self._on_received is not None:
            self._on_received(stream)
        try:
            result = handler(*args)
        except Exception:
            self._reject(stream, "handler_error")
            log.exception("handler for %s failed", stream)
            return None
        return result if isinstance(result, Awaitable) else None

    def _reject(self, stream: str, reason: str) -> None:
        self.rejected[(stream, reason)] += 1
        if self._on_rejected is not None:
            self._on_rejected(stream, reason)
