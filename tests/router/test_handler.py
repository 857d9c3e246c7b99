"""The router's decision and forwarding logic in-process, with a test double standing in for Dynamo's KvRouter."""

from __future__ import annotations

import random
from typing import Any

import pytest
from dynamo.llm import compute_block_hash_for_seq

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.publisher import EvidencePublisher
from semblend_dynamo.events.schemas import (
    DonorHint,
    DonorLifecycle,
    DonorRegistration,
    KvEvent,
    KvEventBatch,
    KvStored,
    OutcomeReport,
    RouteEvidence,
    request_key,
)
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.router.__main__ import build_discovery
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.handler import BadRequest, SemanticRouter
from semblend_dynamo.router.metrics import RouterMetrics

W1, W2 = 101, 202
BLOCK = 16


class KvRouterTestDouble:
    """Answers overlap and load queries from fixed tables and records forwarded requests."""

    def __init__(self) -> None:
        self.device_blocks = {W1: 0, W2: 0}
        self.active = {W1: 0, W2: 0}
        self.forwarded: list[dict[str, Any]] = []

    async def get_overlap_scores(self, token_ids: list[int], **_: Any) -> dict[str, Any]:
        return {"workers": [{"worker_id": w, "dp_rank": 0, "device_blocks": b} for w, b in self.device_blocks.items()]}

    async def get_potential_loads(self, token_ids: list[int]) -> list[dict[str, int]]:
        return [{"worker_id": w, "dp_rank": 0, "active_requests": a} for w, a in self.active.items()]

    async def generate_from_request(self, request: dict[str, Any]) -> Any:
        self.forwarded.append(request)
        allowed = (request.get("routing") or {}).get("allowed_worker_ids") or [W2]

        async def stream() -> Any:
            yield {
                "token_ids": [1],
                "routing_data": {"worker_id": {"decode_worker_id": allowed[0], "decode_dp_rank": 0}},
            }

        return stream()

    async def dump_events(self) -> str:
        return "[]"


class ConnectedLinkTestDouble(NatsLink):
    """A NatsLink that reports itself connected and publishes nowhere."""

    @property
    def connected(self) -> bool:
        return True


def _router(
    link_cls: type[NatsLink] = ConnectedLinkTestDouble, **settings: Any
) -> tuple[SemanticRouter, KvRouterTestDouble]:
    cfg = SemblendConfig(block_size=BLOCK, embedder="hash", min_span_tokens=32, min_donor_tokens=64, **settings)
    link = link_cls(cfg, name="test")
    kv = KvRouterTestDouble()
    discovery = build_discovery(cfg)
    router = SemanticRouter(
        cfg,
        kv_router=kv,
        discovery=discovery,
        catalog=DonorCatalog(100, discovery),
        link=link,
        publisher=EvidencePublisher(link, queue_size=8),
        metrics=RouterMetrics(),
        namespace_of=lambda lora, salt: NamespaceKey(
            model_id=cfg.model_id, tokens_per_block=BLOCK, lora=lora, cache_salt=salt
        ),
        deployment="dep",
    )
    return router, kv


RNG = random.Random(5)
DOCS = [[RNG.randrange(100, 7000) for _ in range(96)] for _ in range(3)]


def _prompt(order: tuple[int, ...]) -> list[int]:
    return [RNG.randrange(100, 7000) for _ in range(32)] + [t for i in order for t in DOCS[i]]


def _make_resident_donor(router: SemanticRouter, tokens: list[int], worker: int) -> None:
    """What the router does after serving ``tokens`` on ``worker``, then the worker's stored event."""
    routed = router.parse({"token_ids": tokens})
    hashes = compute_block_hash_for_seq(tokens, BLOCK)
    router.catalog.add(
        DonorRegistration(
            donor_id="donor",
            donor_key=request_key(tokens),
            worker_id=worker,
            deployment="dep",
            namespace=routed.namespace.digest(),
            num_tokens=len(tokens),
            block_size=BLOCK,
            block_hashes=hashes,
            embedding=b"",
            embedding_dim=0,
        ),
        local=(routed.namespace, tokens),
    )
    stored = KvStored(block_hashes=list(range(1, len(hashes) + 1)), tokens_hashes=hashes)
    router.on_kv_events(KvEventBatch(1, 0, 0, [KvEvent(worker_id=worker, event_id=1, data=stored)]))


async def _run(router: SemanticRouter, request: dict[str, Any]) -> list[dict[str, Any]]:
    return [out async for out in router.generate(request)]


@pytest.mark.parametrize(
    "bad", [{}, {"token_ids": []}, {"token_ids": "abc"}, {"token_ids": [-1]}, {"token_ids": [1], "routing": 3}]
)
def test_bad_requests_get_a_clear_error(bad: dict[str, Any]) -> None:
    router, _ = _router()
    with pytest.raises(BadRequest):
        router.parse(bad)


async def test_reordered_prompt_is_placed_on_the_donor_worker_with_a_hint() -> None:
    router, kv = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    assert router.catalog.is_resident("donor")
    target = _prompt((2, 0, 1))
    outputs = await _run(router, {"token_ids": target})
    assert outputs[0]["routing_data"]["worker_id"]["decode_worker_id"] == W1
    sent = kv.forwarded[-1]
    assert sent["routing"]["allowed_worker_ids"] == [W1]
    assert "semblend" not in (sent.get("extra_args") or {})  # the hint travels on NATS only
    assert router.publisher.backlog == 2  # the hint (worker subject) and the RouteEvidence, queued without blocking
    queued = [router.publisher._queue.get_nowait() for _ in range(2)]
    [(subject, hint)] = [(s, m) for s, m in queued if isinstance(m, DonorHint)]
    assert subject == router.subjects.hints(W1)
    assert hint.decision == Outcome.SEMANTIC_PLACEMENT.value and hint.donor_id == "donor"
    assert hint.request_key == request_key(target) and hint.spans
    # one trace id joins the router's evidence and the worker's audit records of this request (docs/sembench.md)
    evidence = next(m for _, m in queued if isinstance(m, RouteEvidence))
    assert hint.role == "recipient" and hint.trace_id is not None and len(hint.trace_id) == 16
    assert evidence.trace_id == hint.trace_id == evidence.hint.trace_id


async def test_overloaded_donor_worker_is_not_forced() -> None:
    router, kv = _router(placement_load_slack=2)
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    kv.active = {W1: 5, W2: 0}
    decision = await router.decide(router.parse({"token_ids": _prompt((1, 2, 0))}))
    assert decision.outcome is Outcome.SEMANTIC_DISCOVERY_ONLY and decision.reason is DeclineReason.CAPACITY
    assert decision.allowed_worker is None and decision.hint is not None


async def test_exact_prefix_wins_and_another_tenant_sees_nothing() -> None:
    router, kv = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    kv.device_blocks[W2] = 20
    exact = await router.decide(router.parse({"token_ids": _prompt((2, 1, 0))}))
    assert exact.outcome is Outcome.EXACT_PREFIX_ROUTE and exact.hint is None
    kv.device_blocks[W2] = 0
    other = router.parse({"token_ids": _prompt((2, 1, 0)), "extra_args": {"nvext": {"cache_salt": "tenantB"}}})
    decision = await router.decide(other)
    assert decision.hint is None and decision.outcome is Outcome.COLD_FALLBACK
    forwarded = router.forward_request({"token_ids": other.tokens}, other, decision)
    assert forwarded["routing"] == {"cache_namespace": "tenantB"}


async def test_without_nats_routing_is_exact_only() -> None:
    router, kv = _router(link_cls=NatsLink)  # never started: disconnected
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    outputs = await _run(router, {"token_ids": _prompt((2, 0, 1))})
    assert outputs and "semblend" not in (kv.forwarded[-1].get("extra_args") or {})
    assert "allowed_worker_ids" not in (kv.forwarded[-1].get("routing") or {})


async def test_connector_reports_of_eviction_remove_the_donor() -> None:
    router, _ = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    report = OutcomeReport(
        request_id="r",
        request_key="k",
        worker_id=W1,
        deployment="dep",
        namespace="n",
        outcome=Outcome.BACKEND_DECLINED,
        rejection_reason=DeclineReason.DONOR_EVICTED,
        donor_id="donor",
    )
    router.on_outcome(report, None)  # type: ignore[arg-type]
    assert "donor" not in router.catalog and "donor" not in router.discovery
    assert router.metrics.outcomes_reported.labels("backend_declined")._value.get() == 1
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    lifecycle = DonorLifecycle(donor_id="donor", worker_id=W1, deployment="dep", namespace="n", event="evicted")
    router.on_donor_event(lifecycle, None)  # type: ignore[arg-type]
    assert "donor" not in router.catalog


async def test_blocks_hinted_and_backend_confirmed_are_counted_per_worker() -> None:
    router, _ = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    await _run(router, {"token_ids": _prompt((2, 0, 1))})
    queued = [router.publisher._queue.get_nowait()[1] for _ in range(router.publisher.backlog)]
    [hint] = [m for m in queued if isinstance(m, DonorHint)]
    placed = sum(length for _, _, length in hint.spans) // BLOCK
    assert placed > 0
    hinted = router.metrics.hinted_blocks.labels(f"{W1:x}", Outcome.SEMANTIC_PLACEMENT.value)
    assert hinted._value.get() == placed
    report = OutcomeReport(
        request_id="r",
        request_key="k",
        worker_id=W1,
        deployment="dep",
        namespace="n",
        outcome=Outcome.BACKEND_MATERIALIZED,
        materialized_tokens=3 * BLOCK + 5,
        donor_id="donor",
    )
    router.on_outcome(report, None)  # type: ignore[arg-type]
    assert router.metrics.confirmed_blocks.labels(f"{W1:x}")._value.get() == 3  # whole blocks only
