"""Router hints waiting for their request: a bounded, thread-safe inbox keyed by ``request_key``.

Hints reach a worker one way: on its NATS hint subject, where :class:`~trtllm_connector.outcome_link.OutcomeLink`
calls :meth:`HintInbox.submit_bytes` (``dynamo.trtllm`` passes TensorRT-LLM none of a request's ``extra_args``, so
nothing the router adds to the request can reach the connector; docs/trtllm.md). The scheduler takes the hint in
``get_num_new_matched_tokens`` by the key it computes from the prompt tokens. A hint is advisory: the scheduler
re-validates everything it says.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from semblend_dynamo.events.codec import RejectedMessage, decode
from semblend_dynamo.events.schemas import DonorHint


class HintInbox:
    """Hints by request key; the oldest are dropped beyond ``capacity`` and after ``ttl_s`` (both counted)."""

    def __init__(
        self,
        *,
        capacity: int = 4096,
        ttl_s: float = 60.0,
        max_message_bytes: int = 1 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.max_message_bytes = max_message_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._hints: OrderedDict[str, tuple[float, DonorHint]] = OrderedDict()
        self.rejected: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def submit(self, hint: DonorHint) -> None:
        """Store a validated hint (a later hint for the same request replaces the earlier one)."""
        with self._lock:
            self._hints.pop(hint.request_key, None)
            self._hints[hint.request_key] = (self._clock(), hint)
            while len(self._hints) > self.capacity:
                self._hints.popitem(last=False)
                self.dropped["capacity"] += 1

    def submit_bytes(self, data: bytes) -> bool:
        """Decode one enveloped hint message (NATS); malformed ones are counted by reason and dropped."""
        try:
            hint = decode(data, DonorHint, max_bytes=self.max_message_bytes)
        except RejectedMessage as exc:
            with self._lock:
                self.rejected[exc.reason] += 1
            return False
        self.submit(hint)
        return True

    def take(self, request_key: str) -> DonorHint | None:
        """Called from ``get_num_new_matched_tokens``: the hint for this prompt, removed from the inbox."""
        if not self._hints:  # nothing to take or expire (a hint submitted meanwhile is as if it came after this call)
            return None
        with self._lock:
            entry = self._hints.pop(request_key, None)
            self._expire()
        if entry is None:
            return None
        received, hint = entry
        if self._clock() - received > self.ttl_s:
            with self._lock:
                self.dropped["expired"] += 1
            return None
        return hint

    def __len__(self) -> int:
        with self._lock:
            return len(self._hints)

    def _expire(self) -> None:
        deadline = self._clock() - self.ttl_s
        while self._hints:
            received, _ = next(iter(self._hints.values()))
            if received > deadline:
                break
            self._hints.popitem(last=False)
            self.dropped["expired"] += 1
