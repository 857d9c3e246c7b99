"""Prompt embeddings never hold the event loop: over budget or queue full, a request routes exact-only, counted."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Sequence

import numpy as np

from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.router.embedding import EmbeddingUnavailable, PromptEmbeddings
from tests.router.test_handler import W1, _make_resident_donor, _prompt, _router


class BlockingEmbedderTestDouble:
    """``embed_prompts`` that blocks its (worker) thread until released; returns unit vectors afterwards."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.release = threading.Event()
        self.entered = threading.Event()
        self.prompts_seen = 0
        self.released_by_watchdog = False

    def embed_prompts(self, prompts: Sequence[Sequence[int]]) -> list[np.ndarray | None]:
        self.entered.set()
        self.release.wait()
        self.prompts_seen += len(prompts)
        return [np.eye(1, self.dim, 0, dtype=np.float32)[0] for _ in prompts]

    def watchdog(self, seconds: float) -> threading.Timer:
        """Releases the double if a test would otherwise hang (an embedding run on the loop blocks it forever)."""

        def fire() -> None:
            self.released_by_watchdog = True
            self.release.set()

        timer = threading.Timer(seconds, fire)
        timer.start()
        return timer


def _unrelated(rng: random.Random) -> list[int]:
    return [rng.randrange(7000, 9000) for _ in range(200)]


async def test_200_concurrent_requests_none_waits_on_another_embedding() -> None:
    router, _ = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    double = BlockingEmbedderTestDouble(dim=64)
    router.embeddings = PromptEmbeddings(double.embed_prompts, queue_size=8, budget_s=0.05)
    rng = random.Random(3)
    span_path = [router.parse({"token_ids": _prompt((2, 0, 1))}) for _ in range(100)]
    needs_embedding = [router.parse({"token_ids": _unrelated(rng)}) for _ in range(100)]
    timer = double.watchdog(30.0)
    try:
        decisions = await asyncio.gather(*(router.decide(r) for r in [*needs_embedding, *span_path]))
    finally:
        timer.cancel()
    assert not double.released_by_watchdog and not double.release.is_set()  # all 200 decided while it blocks
    assert double.entered.is_set() and router.embeddings.batches == 1  # one batch taken; the rest never started
    embedded, spanned = decisions[:100], decisions[100:]
    assert all(d.outcome is Outcome.SEMANTIC_PLACEMENT for d in spanned)
    assert all(d.reason is DeclineReason.EMBEDDING_OVERLOADED and d.hint is None for d in embedded)
    budget = router.metrics.embeddings.labels("budget")._value.get()
    queue_full = router.metrics.embeddings.labels("queue_full")._value.get()
    assert budget + queue_full == 100 and budget >= 8 and queue_full > 0
    double.release.set()


def embed_nothing_test_double(prompts: Sequence[Sequence[int]]) -> list[np.ndarray | None]:
    """``embed_prompts`` of an embedder that can embed no prompt (undecodable ids, a model giving NaN)."""
    return [None] * len(prompts)


async def test_a_prompt_that_cannot_be_embedded_routes_exact_only_declined_as_invalid_embedding() -> None:
    router, _ = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    router.embeddings = PromptEmbeddings(embed_nothing_test_double, queue_size=8, budget_s=5.0)
    decision = await router.decide(router.parse({"token_ids": _unrelated(random.Random(5))}))
    assert decision.reason is DeclineReason.INVALID_EMBEDDING and decision.hint is None
    assert decision.allowed_worker is None
    assert router.metrics.embeddings.labels("error")._value.get() == 1


async def test_the_worker_batches_and_a_budget_kept_gives_the_vector() -> None:
    double = BlockingEmbedderTestDouble(dim=8)
    embeddings = PromptEmbeddings(double.embed_prompts, queue_size=64, budget_s=30.0, max_batch=16)
    first = asyncio.ensure_future(embeddings.for_request([1, 2, 3]))
    await asyncio.sleep(0)
    await asyncio.get_running_loop().run_in_executor(None, double.entered.wait)
    rest = [asyncio.ensure_future(embeddings.for_request([i])) for i in range(20)]
    donor = asyncio.ensure_future(embeddings.for_donor([9, 9]))
    await asyncio.sleep(0)
    assert embeddings.queued == 21  # waiting behind the blocked first batch
    double.release.set()
    vectors = await asyncio.gather(first, *rest, donor)
    assert all(v is not None and v.shape == (8,) for v in vectors)
    assert double.prompts_seen == 22 and embeddings.batches == 3  # 1, then 16 requests, then 4 + the donor
    embeddings.close()


async def test_a_full_queue_is_refused_at_once() -> None:
    double = BlockingEmbedderTestDouble(dim=4)
    embeddings = PromptEmbeddings(double.embed_prompts, queue_size=2, budget_s=30.0, max_batch=1)
    waiting = [asyncio.ensure_future(embeddings.for_request([i])) for i in range(3)]  # 1 running + 2 queued
    await asyncio.sleep(0)
    try:
        await embeddings.for_request([99])
    except EmbeddingUnavailable as exc:
        assert exc.reason == "queue_full"
    else:
        raise AssertionError("a full queue must refuse")
    double.release.set()
    assert len(await asyncio.gather(*waiting)) == 3
    embeddings.close()
