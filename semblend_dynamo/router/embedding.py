"""Prompt embeddings off the event loop: a bounded queue, one worker thread, batches, a time budget per request.

The event loop only enqueues and awaits. A request whose prompt embedding is not back within the budget, or that
finds the queue full, is told so at once (:class:`EmbeddingUnavailable`) and routes exact-only; its queued work is
dropped if no batch took it yet. Donor registrations use the same worker at lower priority and no budget: they
wait behind requests, never ahead of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

EmbedBatch = Callable[[Sequence[Sequence[int]]], list[np.ndarray | None]]
"""Blocking: one vector (or None) per prompt, in order (``DonorDiscovery.embed_prompts``)."""

MAX_BATCH = 32


class EmbeddingUnavailable(Exception):
    """No embedding for this request: ``reason`` is ``queue_full`` or ``budget``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PromptEmbeddings:
    """The router's one embedding worker; see the module docstring."""

    def __init__(self, embed_batch: EmbedBatch, *, queue_size: int, budget_s: float, max_batch: int = MAX_BATCH):
        self._embed_batch = embed_batch
        self.queue_size = queue_size
        self.budget_s = budget_s
        self.max_batch = max_batch
        self._requests: deque[tuple[Sequence[int], asyncio.Future[np.ndarray | None]]] = deque()
        self._background: deque[tuple[Sequence[int], asyncio.Future[np.ndarray | None]]] = deque()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semblend-router-embed")
        self._running = False
        self.batches = 0

    @property
    def queued(self) -> int:
        return len(self._requests) + len(self._background)

    async def for_request(self, tokens: Sequence[int]) -> np.ndarray | None:
        """The prompt's vector within the budget; raises :class:`EmbeddingUnavailable` otherwise."""
        if len(self._requests) >= self.queue_size:
            raise EmbeddingUnavailable("queue_full")
        future = self._enqueue(self._requests, tokens)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.budget_s)
        except TimeoutError:
            raise EmbeddingUnavailable("budget") from None
        finally:
            future.cancel()  # over budget or the request cancelled: a batch that has not taken it skips it

    async def for_donor(self, tokens: Sequence[int]) -> np.ndarray | None:
        """A donor's vector, after every queued request; None when the background queue is full."""
        if len(self._background) >= self.queue_size:
            return None
        return await self._enqueue(self._background, tokens)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _enqueue(
        self, queue: deque[tuple[Sequence[int], asyncio.Future[np.ndarray | None]]], tokens: Sequence[int]
    ) -> asyncio.Future[np.ndarray | None]:
        future: asyncio.Future[np.ndarray | None] = asyncio.get_running_loop().create_future()
        queue.append((tokens, future))
        self._kick()
        return future

    def _kick(self) -> None:
        if self._running:
            return
        batch: list[tuple[Sequence[int], asyncio.Future[np.ndarray | None]]] = []
        for queue in (self._requests, self._background):
            while queue and len(batch) < self.max_batch:
                item = queue.popleft()
                if not item[1].done():
                    batch.append(item)
        if not batch:
            return
        self._running = True
        self.batches += 1
        work = asyncio.get_running_loop().run_in_executor(self._executor, self._embed_batch, [t for t, _ in batch])
        work.add_done_callback(lambda done: self._finished(done, batch))

    def _finished(
        self, done: asyncio.Future[list[np.ndarray | None]], batch: list[tuple[Sequence[int], asyncio.Future]]
    ) -> None:
        self._running = False
        try:
            vectors: list[np.ndarray | None] = done.result()
        except Exception:
            vectors = [None] * len(batch)
        for (_, future), vector in zip(batch, vectors, strict=False):
            if not future.done():
                future.set_result(vector)
        for _, future in batch[len(vectors) :]:
            if not future.done():
                future.set_result(None)
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._kick()
