"""The router's decision and forwarding logic in-process, with a test double standing in for Dynamo's KvRouter."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Iterator
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
from tests.support.gates import GateDecidingAfterFirstWait
from tests.support.small_maps import small_block_maps

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


def _make_resident_donor(
    router: SemanticRouter, tokens: list[int], worker: int, donor_id: str = "donor", *, drain: bool = True
) -> None:
    """What the router does after serving ``tokens`` on ``worker``, then the worker's stored event (then, with
    ``drain``, waits for the indexer)."""
    routed = router.parse({"token_ids": tokens})
    hashes = compute_block_hash_for_seq(tokens, BLOCK)
    router.catalog.add(
        DonorRegistration(
            donor_id=donor_id,
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
    if drain:
        assert router.catalog.drain(10)  # the pipeline follows the catalog on the indexer thread


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


async def test_the_load_query_carries_one_block_of_the_prompt() -> None:
    """Only the workers' active requests are read from Dynamo's load query, and they do not depend on the tokens:
    the query gets the prompt's first block, so the runtime does not copy an 8K-token list a second time."""
    router, kv = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    asked: list[list[int]] = []
    answer: asyncio.Future[list[dict[str, int]]] = asyncio.get_running_loop().create_future()
    answer.set_result([{"worker_id": W1, "dp_rank": 0, "active_requests": 0}])

    def loads(token_ids: list[int]) -> asyncio.Future[list[dict[str, int]]]:
        asked.append(token_ids)
        return answer

    kv.get_potential_loads = loads  # type: ignore[method-assign]
    routed = router.parse({"token_ids": _prompt((2, 1, 0))})
    decision = await router.decide(routed)
    assert decision.outcome is Outcome.SEMANTIC_PLACEMENT
    assert asked == [routed.tokens[: router.cfg.block_size]]


async def test_the_load_query_is_asked_before_the_spans_are_searched_and_its_failure_routes_exact_only() -> None:
    router, kv = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    assert router.discovery is not None
    order: list[str] = []
    search = router.discovery.discover
    router.discovery.discover = lambda *a, **k: order.append("spans") or search(*a, **k)  # type: ignore[method-assign]
    answer: asyncio.Future[list[dict[str, int]]] = asyncio.get_running_loop().create_future()

    def loads(token_ids: list[int]) -> asyncio.Future[list[dict[str, int]]]:
        order.append("loads")  # asked, as Dynamo's runtime starts the query when it is called
        return answer

    kv.get_potential_loads = loads  # type: ignore[method-assign]
    answer.set_result([{"worker_id": W1, "dp_rank": 0, "active_requests": 0}])
    decision = await router.decide(router.parse({"token_ids": _prompt((2, 1, 0))}))
    assert order == ["loads", "spans"] and decision.outcome is Outcome.SEMANTIC_PLACEMENT

    failed: asyncio.Future[list[dict[str, int]]] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("load query failed"))
    kv.get_potential_loads = lambda token_ids: failed  # type: ignore[method-assign]
    decision = await router.decide(router.parse({"token_ids": _prompt((1, 0, 2))}))
    assert decision.reason is DeclineReason.INTERNAL_ERROR and decision.allowed_worker is None


async def test_the_load_query_is_asked_with_the_exact_query_and_dropped_when_exact_wins() -> None:
    router, kv = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    loop = asyncio.get_running_loop()
    asked: list[str] = []
    overlap: asyncio.Future[dict[str, Any]] = loop.create_future()
    answer: asyncio.Future[list[dict[str, int]]] = loop.create_future()

    def exact(token_ids: list[int], **_: Any) -> asyncio.Future[dict[str, Any]]:
        asked.append("exact")
        return overlap

    def loads(token_ids: list[int]) -> asyncio.Future[list[dict[str, int]]]:
        asked.append("loads")
        return answer

    kv.get_overlap_scores = exact  # type: ignore[method-assign]
    kv.get_potential_loads = loads  # type: ignore[method-assign]
    deciding = asyncio.ensure_future(router.decide(router.parse({"token_ids": _prompt((2, 1, 0))})))
    await asyncio.sleep(0)
    assert asked == ["loads", "exact"] and not deciding.done()  # both in flight before the exact answer is back
    answer.set_result([{"worker_id": W1, "dp_rank": 0, "active_requests": 0}])
    overlap.set_result({"workers": [{"worker_id": W2, "dp_rank": 0, "device_blocks": 0}]})
    assert (await deciding).outcome is Outcome.SEMANTIC_PLACEMENT

    overlap = loop.create_future()
    overlap.set_result({"workers": [{"worker_id": W2, "dp_rank": 0, "device_blocks": 20}]})
    answer = loop.create_future()
    decision = await router.decide(router.parse({"token_ids": _prompt((1, 0, 2))}))
    assert decision.outcome is Outcome.EXACT_PREFIX_ROUTE and answer.cancelled()

    def refusing(token_ids: list[int]) -> Any:
        raise TypeError("token ids the runtime cannot take")

    kv.get_potential_loads = refusing  # type: ignore[method-assign]
    overlap = loop.create_future()
    overlap.set_result({"workers": [{"worker_id": W2, "dp_rank": 0, "device_blocks": 0}]})
    decision = await router.decide(router.parse({"token_ids": _prompt((0, 2, 1))}))
    assert decision.reason is DeclineReason.INTERNAL_ERROR and decision.allowed_worker is None


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
    assert "donor" not in router.catalog and router.catalog.drain(10) and "donor" not in router.discovery
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


# --- prefill chains ---------------------------------------------------------------------------------------------
CHAIN_SETTINGS = dict(
    exact_materialization_only=False, isolation="cache_salt", chain_enabled=True, chain_step_overhead_tokens=0
)


class ChainKvRouterTestDouble(KvRouterTestDouble):
    """Also notes how many messages were queued for NATS when each request was forwarded, and can make chain steps
    (``max_tokens == 1``) hang, fail or land on another worker."""

    def __init__(self, router_of: Any, step_fault: str | None = None) -> None:
        super().__init__()
        self.router_of = router_of
        self.step_fault = step_fault
        self.queued_at_forward: list[int] = []
        self.closed_streams = 0

    async def generate_from_request(self, request: dict[str, Any]) -> Any:
        self.queued_at_forward.append(self.router_of().publisher.backlog)
        if request["stop_conditions"].get("max_tokens") != 1 or self.step_fault is None:
            return await super().generate_from_request(request)
        self.forwarded.append(request)
        if self.step_fault == "error":
            raise RuntimeError("worker went away")
        double = self

        async def stream() -> Any:
            try:
                if double.step_fault == "timeout":
                    await asyncio.Event().wait()
                yield {"token_ids": [1], "routing_data": {"worker_id": {"decode_worker_id": W2, "decode_dp_rank": 0}}}
            finally:
                double.closed_streams += 1

        return stream()


def _chain_router(step_fault: str | None = None, **settings: Any) -> tuple[SemanticRouter, ChainKvRouterTestDouble]:
    router, _ = _router(**{**CHAIN_SETTINGS, "chain_step_timeout_s": 0.05, **settings})
    kv = ChainKvRouterTestDouble(lambda: router, step_fault)
    router.kv_router = kv
    return router, kv


def _own(n: int) -> list[int]:
    return [RNG.randrange(7000, 9000) for _ in range(n)]


# donor: [32 other][DOC0][DOC1]; recipient: [32 own][DOC0][32 own][DOC1][16 own] = 272 tokens. With 16-token blocks
# and a 16-token head: load 1 is DOC0's target [48, 128), load 2 is DOC1's [176, 256); steps of 48 and 176 tokens.
CHAIN_DONOR = _own(32) + DOCS[0] + DOCS[1]
CHAIN_RECIPIENT = _own(32) + DOCS[0] + _own(32) + DOCS[1] + _own(16)


def _queued(router: SemanticRouter) -> list[tuple[str, Any]]:
    return [router.publisher._queue.get_nowait() for _ in range(router.publisher.backlog)]


async def test_chain_runs_its_steps_on_the_donor_worker_under_one_salt_then_the_request() -> None:
    router, kv = _chain_router()
    _make_resident_donor(router, CHAIN_DONOR, W1)
    caller = {"token_ids": CHAIN_RECIPIENT, "stop_conditions": {"max_tokens": 7}}
    outputs = await _run(router, caller)
    assert outputs and outputs[0]["routing_data"]["worker_id"]["decode_worker_id"] == W1
    assert [len(r["token_ids"]) for r in kv.forwarded] == [48, 176, 272]
    assert all(r["token_ids"] == CHAIN_RECIPIENT[: len(r["token_ids"])] for r in kv.forwarded)
    assert [r["stop_conditions"] for r in kv.forwarded] == [{"max_tokens": 1}, {"max_tokens": 1}, {"max_tokens": 7}]
    assert all(r["routing"]["allowed_worker_ids"] == [W1] for r in kv.forwarded)
    salts = {(r["routing"]["cache_namespace"], r["extra_args"]["nvext"]["cache_salt"]) for r in kv.forwarded}
    [(salt, nvext_salt)] = salts
    assert salt == nvext_salt and salt.startswith("|") and len(salt) > 1  # default tenant "", a per-request nonce
    assert kv.queued_at_forward == [1, 2, 3]  # each request's hint is queued before it is sent
    queued = _queued(router)
    hints = [(subject, m) for subject, m in queued if isinstance(m, DonorHint)]
    assert [s for s, _ in hints] == [router.subjects.hints(W1)] * 3
    assert [h.role for _, h in hints] == ["chain_step", "chain_step", "recipient"]
    assert [h.request_key for _, h in hints] == [request_key(CHAIN_RECIPIENT[:n]) for n in (48, 176, 272)]
    assert [h.spans for _, h in hints] == [[], [(48, 48, 80)], [(144, 176, 80)]]
    assert {h.chain_head_tokens for _, h in hints} == {16} and {h.donor_id for _, h in hints} == {"donor"}
    assert len({h.trace_id for _, h in hints}) == 1
    [evidence] = [m for _, m in queued if isinstance(m, RouteEvidence)]
    assert evidence.outcome == Outcome.SEMANTIC_PLACEMENT and evidence.decline_reason is None
    assert evidence.hint == hints[-1][1] and evidence.worker_id == W1
    assert router.metrics.chain_steps.labels("ok")._value.get() == 2
    stages = evidence.stage_latency_us  # every stage before forwarding is timed and inside the total
    timed = ("parse", "ask_loads", "exact", "semantic", "load", "chain_steps", "hint")
    assert set(timed) <= stages.keys()
    assert sum(stages[s] for s in timed) <= stages["total_added"]
    assert sum(stages[s] for s in ("ask_loads", "exact", "semantic", "load")) <= stages["decide"]
    assert stages["parse"] + stages["decide"] + stages["chain_steps"] + stages["hint"] <= stages["total_added"]
    for stage in (
        *timed,
        "decide",
        "total_added",
        "forward_first_response",
    ):  # each stage observed once, after the request
        assert router.metrics.stage_latency.labels(stage)._sum.get() == pytest.approx(stages[stage] / 1e6)


async def test_draining_registrations_lets_go_of_an_indexer_a_sync_holds() -> None:
    router, _ = _router()
    indexer = router.catalog.indexer
    assert indexer is not None and router.discovery is not None
    indexer.hold(True)  # as during a sync's adds
    _make_resident_donor(router, _prompt((0, 1, 2)), W1, "held", drain=False)
    assert indexer.backlog == 1 and not router.catalog.drain(0.1)  # held: nothing applied
    router.refresh_gauges()
    assert router.metrics.indexer_held._value.get() == 1 and router.metrics.indexer_backlog._value.get() == 1
    await router.drain_registrations(timeout=10)
    assert not indexer.held and indexer.backlog == 0 and "held" in router.discovery
    router.refresh_gauges()
    assert router.metrics.indexer_held._value.get() == 0 and router.metrics.indexer_backlog._value.get() == 0


async def test_only_the_chained_request_becomes_a_donor_under_the_salt_it_ran_with() -> None:
    router, kv = _chain_router()
    _make_resident_donor(router, CHAIN_DONOR, W1)
    await _run(router, {"token_ids": CHAIN_RECIPIENT})
    await router.drain_registrations()
    salt = kv.forwarded[-1]["routing"]["cache_namespace"]
    added = [m for _, m in _queued(router) if isinstance(m, DonorRegistration)]
    [registration] = added  # the 48- and 176-token steps are not donors
    assert registration.num_tokens == len(CHAIN_RECIPIENT) and registration.worker_id == W1
    assert registration.block_hashes == compute_block_hash_for_seq(CHAIN_RECIPIENT, BLOCK, cache_namespace=salt)


@pytest.mark.parametrize("fault", ["timeout", "error", "wrong_worker"])
async def test_a_failed_step_sends_the_request_cold_under_a_fresh_salt(fault: str) -> None:
    router, kv = _chain_router(step_fault=fault)
    _make_resident_donor(router, CHAIN_DONOR, W1)
    outputs = await _run(router, {"token_ids": CHAIN_RECIPIENT})
    assert outputs  # the request is still served
    step, real = kv.forwarded
    assert len(step["token_ids"]) == 48 and len(real["token_ids"]) == len(CHAIN_RECIPIENT)
    assert "allowed_worker_ids" not in real["routing"]
    assert real["routing"]["cache_namespace"] == real["extra_args"]["nvext"]["cache_salt"]
    assert real["routing"]["cache_namespace"] not in ("", step["routing"]["cache_namespace"])
    assert kv.closed_streams == (0 if fault == "error" else 1)  # a timed-out step is cancelled, its stream closed
    queued = _queued(router)
    assert [m.role for _, m in queued if isinstance(m, DonorHint)] == ["chain_step"]  # the real request: no hint
    [evidence] = [m for _, m in queued if isinstance(m, RouteEvidence)]
    assert evidence.outcome == Outcome.COLD_FALLBACK and evidence.decline_reason == "chain_step_failed"
    assert evidence.hint is None
    assert router.metrics.chain_steps.labels(fault)._value.get() == 1
    assert router.metrics.declines.labels("chain_step_failed")._value.get() == 1


@pytest.mark.parametrize("settings", [{"chain_enabled": False}, {"isolation": "no_block_reuse"}])
async def test_without_chains_or_salted_block_reuse_the_placement_is_declined_as_before(settings: dict) -> None:
    router, kv = _chain_router(**settings)
    _make_resident_donor(router, CHAIN_DONOR, W1)
    await _run(router, {"token_ids": CHAIN_RECIPIENT})
    [sent] = kv.forwarded
    assert "cache_namespace" not in sent["routing"]  # the caller's salt (none) is kept
    [evidence] = [m for _, m in _queued(router) if isinstance(m, RouteEvidence)]
    assert evidence.decline_reason == "not_prefix_contiguous"
    assert evidence.hint is not None and evidence.hint.chain_head_tokens is None


async def test_an_accepted_plain_plan_stays_plain_unless_the_chain_loads_more() -> None:
    router, kv = _chain_router()
    _make_resident_donor(router, CHAIN_DONOR, W1)
    # the donor's own first 128 tokens, then new words: the plain prefix load takes it all, no chain
    plain = CHAIN_DONOR[:128] + _own(48)
    await _run(router, {"token_ids": plain})
    assert len(kv.forwarded) == 1 and "cache_namespace" not in kv.forwarded[0]["routing"]
    # the same prefix, then DOC1 behind new words: the chain loads DOC1 too
    await _run(router, {"token_ids": CHAIN_DONOR[:128] + _own(32) + DOCS[1] + _own(16)})
    assert [len(r["token_ids"]) for r in kv.forwarded[1:]] == [16, 176, 272]  # the first span's head is recomputed


@contextlib.contextmanager
def _lock_held_by_another_thread(catalog: DonorCatalog) -> Iterator[None]:
    """Another thread's write, stopped half way, for the body's length: the loop's kv-event batches queue meanwhile."""
    entered, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with catalog._lock:
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert entered.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join(10)


async def test_a_kv_event_batch_queued_behind_another_threads_hold_is_applied_by_the_loop_without_another_event() -> (
    None
):
    """A batch that found the catalog's lock held by another thread is not waited for; the loop applies it soon after
    that thread lets the lock go (no later kv-event needed), and an event-id gap it reveals starts the resync."""
    router, _ = _router()
    catalog = router.catalog
    router.on_kv_events(KvEventBatch(1, 0, 0, [KvEvent(worker_id=W1, event_id=1, data=KvStored([1], [71]))]))
    with _lock_held_by_another_thread(catalog):
        router.on_kv_events(KvEventBatch(1, 0, 0, [KvEvent(worker_id=W1, event_id=5, data=KvStored([2], [77]))]))
        queued = catalog.kv_queued
    assert queued and router._gap_resync is None  # not applied yet: its gap is not known
    for _ in range(1000):
        if not catalog.kv_queued:
            break
        await asyncio.sleep(0.002)
    assert not catalog.kv_queued and catalog.stored_together([71, 77])
    assert router._gap_resync is not None  # event ids 2-4 were missed
    router._gap_resync.cancel()


async def test_a_queued_kv_event_batch_that_fails_to_apply_is_counted_as_a_direct_one_is() -> None:
    """A batch applied later, off its message's handler, and failing there is logged and counted where a batch failing
    in its handler is (``semblend_router_events_rejected{stream="kv_events", reason="handler_error"}``); the batches
    after it still apply."""
    router, _ = _router()
    catalog = router.catalog
    rejected = router.metrics.events_rejected.labels("kv_events", "handler_error")
    apply = catalog._residency.apply

    def apply_but_block_66(event: KvEvent) -> None:
        if isinstance(event.data, KvStored) and 66 in event.data.tokens_hashes:
            raise RuntimeError("a batch the catalog cannot apply")
        apply(event)

    catalog._residency.apply = apply_but_block_66  # type: ignore[method-assign]
    with _lock_held_by_another_thread(catalog):  # both batches wait in the queue
        router.on_kv_events(KvEventBatch(1, 0, 0, [KvEvent(worker_id=W1, event_id=1, data=KvStored([1], [66]))]))
        router.on_kv_events(KvEventBatch(1, 0, 0, [KvEvent(worker_id=W1, event_id=2, data=KvStored([2], [71]))]))
        assert catalog.kv_queued and rejected._value.get() == 0
    for _ in range(1000):
        if not catalog.kv_queued:
            break
        await asyncio.sleep(0.002)
    assert not catalog.kv_queued and catalog.stored_together([71])
    assert rejected._value.get() == 1


async def test_the_loop_settles_block_maps_the_kv_events_left_mid_rewrite_and_trims_the_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kv-events that stop while block maps rewrite their bases leave two bases held; soon after, the loop writes the
    rest a bounded step per turn (not while a sync is adding its peers' donors), then hands the freed heap back."""
    from semblend_dynamo.router import handler as handler_module
    from semblend_dynamo.router.sync import SyncSession

    small_block_maps(monkeypatch)
    monkeypatch.setattr(handler_module, "SETTLE_DELAY_S", 0.01)
    monkeypatch.setattr(handler_module, "SETTLE_ENTRIES", 100)
    monkeypatch.setattr(handler_module, "TRIM_AFTER_SETTLED", 1)
    trims: list[int] = []
    monkeypatch.setattr(handler_module, "trim_heap", lambda: trims.append(1) or True)
    steps: list[int] = []
    settle = DonorCatalog.settle_maps
    monkeypatch.setattr(DonorCatalog, "settle_maps", lambda self, n: steps.append(n) or settle(self, n))
    router, _ = _router()
    session = router._sync = SyncSession(4)
    session._peers["peer"] = object()  # type: ignore[assignment]  # a peer still being synced
    for event_id, first in enumerate(range(0, 6_000, 200), start=1):
        stored = KvStored(list(range(first, first + 200)), list(range(10**6 + first, 10**6 + first + 200)))
        router.on_kv_events(KvEventBatch(1, 0, 0, [KvEvent(worker_id=W1, event_id=event_id, data=stored)]))
    blocks = router.catalog._residency._workers[(W1, 0)]
    assert blocks.by_block.rewriting or blocks.hashes.rewriting
    router.refresh_gauges()
    assert router.metrics.maps_rewrite_left._value.get() > 0
    await asyncio.sleep(0.1)
    assert not steps and (blocks.by_block.rewriting or blocks.hashes.rewriting)  # the sync adds first
    session._peers.clear()
    for _ in range(2_000):
        if not router.settling:
            break
        await asyncio.sleep(0.002)
    assert not blocks.by_block.rewriting and not blocks.hashes.rewriting
    assert len(steps) > 2 and set(steps) == {100}  # in bounded steps, one a loop turn
    assert trims == [1] and not router.settling
    router.refresh_gauges()
    assert router.metrics.maps_rewrite_left._value.get() == 0
    assert router.catalog.stored_together(list(range(10**6, 10**6 + 6_000, 97)))
    router.close()


# --- background donor work held off while a request is on its way ----------------------------------------------------
async def test_background_steps_stay_held_off_until_the_hint_is_written() -> None:
    """The hint's write is on the request's path: the donor and indexer threads start no step before it is out."""
    router, _ = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    held_while_sending: list[bool] = []
    send_first = router.publisher.send_first

    async def recording_send_first(subject: str, event: Any, timeout: float) -> bool:
        held_while_sending.append(router.gate.busy)
        return await send_first(subject, event, timeout)

    router.publisher.send_first = recording_send_first  # type: ignore[method-assign]
    await _run(router, {"token_ids": _prompt((2, 0, 1))})
    assert held_while_sending == [True]
    assert not router.gate.busy  # released once the request is forwarded


async def test_the_donor_thread_waits_for_a_decision_that_started_while_it_hashed() -> None:
    router, _ = _router()
    gate = router.gate = GateDecidingAfterFirstWait()
    tokens = _prompt((0, 1, 2))
    routed = router.parse({"token_ids": tokens})
    adding = threading.Thread(target=router._add_donor, args=(routed, (W1, 0), None))
    adding.start()
    adding.join(0.2)
    assert adding.is_alive() and len(router.catalog) == 0  # hashed, then held before the catalog's add
    gate.deciding_now.__exit__(None, None, None)
    adding.join(10)
    assert not adding.is_alive() and len(router.catalog) == 1


async def test_a_span_search_keeps_the_gil_while_a_background_step_runs() -> None:
    """The donor thread counts as stepping from its first step until it is done; a search meanwhile keeps the GIL."""
    router, _ = _router()
    assert router.discovery is not None and router.discovery.aligner.hold_gil == router.gate.stepping
    stepping: list[bool] = []
    add = router.catalog.add

    def recording_add(*args: Any, **kwargs: Any) -> bool:
        stepping.append(router.gate.stepping())
        return add(*args, **kwargs)

    router.catalog.add = recording_add  # type: ignore[method-assign]
    adding = threading.Thread(
        target=router._add_donor, args=(router.parse({"token_ids": _prompt((0, 1, 2))}), (W1, 0), None)
    )
    adding.start()
    adding.join(10)
    assert stepping == [True] and not router.gate.stepping()


def test_a_hint_carries_its_donors_spans_similarity_and_namespace_as_discovery_ranked_them() -> None:
    """``_hint`` reads the donor's similarity, its spans (the plan's, else all found) and the namespace digest from the
    discovery result: the candidate's similarity (None when the donor is not one), whatever the ranking's ties."""
    from semblend_dynamo.pipeline import StageTimings
    from semblend_dynamo.planner import MaterializationPlan, PlanDecision
    from semblend_dynamo.span_aligner import Span

    router, _ = _router()
    assert router.discovery is not None
    routed = router.parse({"token_ids": _prompt((0, 1))})
    rng = random.Random(11)
    for case in range(200):
        names = [f"d{k}" for k in range(rng.randrange(1, 6))]
        spans = [Span(rng.choice(names), rng.randrange(512), 64 * k, 64) for k in range(rng.randrange(0, 8))]
        hits = {n: rng.choice([0.0, 0.5, 0.9]) for n in names if rng.random() < 0.5}
        plan_spans = spans[: rng.randrange(1, len(spans) + 1)] if spans and case % 2 else None
        plan = None if plan_spans is None else MaterializationPlan(plan_spans, 4096, 0, 0.0, False, 0.0, "shifted")
        result = router.discovery._result(
            "r", routed.namespace.digest(), 4096, 0, spans, hits, False, PlanDecision(plan, None), StageTimings()
        )
        similarity = {c.donor_id: c.similarity for c in result.candidates}
        for donor_id in [*names, "absent"]:
            hint = router._hint(routed, result, donor_id, None, W1, 0, Outcome.SEMANTIC_PLACEMENT)
            assert hint.similarity == similarity.get(donor_id)
            assert hint.namespace == routed.namespace.digest()
            chosen = plan_spans if plan_spans is not None else spans
            assert hint.spans == [(s.donor_start, s.target_start, s.length) for s in chosen if s.donor_id == donor_id]


def test_request_path_counters_count_as_their_labelled_children() -> None:
    """The counters bumped on every placement (``spans_during_exact``, ``events_out`` through the publisher's
    ``on_sent``) are their labelled children looked up once: the same series, counted the same."""
    metrics = RouterMetrics()
    for kind in ("hint", "hint", "evidence"):
        metrics.event_out(kind)
    assert metrics.events_out.labels("hint")._value.get() == 2
    assert metrics.events_out.labels("evidence")._value.get() == 1
    metrics.spans_during_exact_of["used"].inc()
    assert metrics.spans_during_exact.labels("used")._value.get() == 1
    assert set(metrics.spans_during_exact_of) == {"used", "wasted", "failed"}
