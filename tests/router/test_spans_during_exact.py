"""The span search run while Dynamo's exact-overlap query is in flight (``SemanticRouter.decide``).

It runs only when no worker rank stores the prompt's blocks that an exact win needs, and then changes nothing but
when the search happens: every decision must be the one the exact-first order gives (the gate forced open below).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from dynamo.llm import compute_block_hash_for_seq

from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.schemas import KvEvent, KvEventBatch, KvStored
from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.router.handler import Decision, RoutedRequest, SemanticRouter
from tests.router.test_handler import (
    BLOCK,
    CHAIN_DONOR,
    CHAIN_RECIPIENT,
    W1,
    W2,
    KvRouterTestDouble,
    _chain_router,
    _make_resident_donor,
    _prompt,
    _router,
)

RESULTS = ("used", "wasted", "failed")


def _searched_ahead(router: SemanticRouter) -> dict[str, float]:
    return {r: router.metrics.spans_during_exact.labels(r)._value.get() for r in RESULTS}


def _summary(decision: Decision) -> dict[str, Any]:
    """Everything a decision routes by (not its timings)."""
    return {
        "outcome": decision.outcome,
        "reason": decision.reason,
        "exact_blocks": decision.exact_blocks,
        "allowed_worker": decision.allowed_worker,
        "hint": None if decision.hint is None else decision.hint.model_dump(exclude={"issued_at"}),
        "chain_steps": [(n, h.model_dump(exclude={"issued_at"})) for n, h in decision.chain_steps],
        "salt": decision.salt,
    }


async def _both_orders(router: SemanticRouter, routed: RoutedRequest) -> tuple[Decision, Decision]:
    """The decision with the search ahead where the gate allows it, then in the exact-first order (gate forced)."""
    ahead = await router.decide(routed)
    gate = router._exact_may_win
    router._exact_may_win = lambda routed: True  # type: ignore[method-assign]
    try:
        first = await router.decide(routed)
    finally:
        router._exact_may_win = gate  # type: ignore[method-assign]
    return ahead, first


def _placement(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    return {"token_ids": _prompt((2, 0, 1))}


def _exact_wins(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    kv.device_blocks[W2] = 20  # Dynamo's index knows blocks the router's residency has not seen: a wasted search
    return _placement(router, kv)


def _partial_exact(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    kv.device_blocks[W2] = 5
    return _placement(router, kv)


def _no_donor(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    return {"token_ids": [t + 7000 for t in _prompt((0, 1, 2))]}  # shares no span with the donor


def _tenant_unknown(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    return {**_placement(router, kv), "extra_args": {"nvext": 3}}


def _overloaded(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    kv.active = {W1: 50, W2: 0}
    return _placement(router, kv)


def _exact_query_raises(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    def refusing(token_ids: list[int], **_: Any) -> Any:
        raise RuntimeError("runtime gone")

    kv.get_overlap_scores = refusing  # type: ignore[method-assign]
    return _placement(router, kv)


def _exact_answer_fails(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    async def failing(token_ids: list[int], **_: Any) -> Any:
        raise RuntimeError("query failed")

    kv.get_overlap_scores = failing  # type: ignore[method-assign]
    return _placement(router, kv)


def _search_ahead_fails(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    assert router.discovery is not None

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("aligner broke")

    router.discovery.find_spans = broken  # type: ignore[method-assign]
    return _placement(router, kv)


def _exact_gate_fails(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
    def broken(hashes: Any) -> bool:
        raise RuntimeError("residency broke")

    router.catalog.stored_together = broken  # type: ignore[method-assign]
    return _placement(router, kv)


def _gate_unsure(arrange: Callable[[SemanticRouter, KvRouterTestDouble], dict[str, Any]]) -> Any:
    """``arrange``, with the catalog's block maps changing on another thread whenever the gate reads them (its
    answer then: None, not known)."""

    def unsure(router: SemanticRouter, kv: KvRouterTestDouble) -> dict[str, Any]:
        request = arrange(router, kv)
        router.catalog.stored_together = lambda hashes: None  # type: ignore[method-assign]
        return request

    return unsure


CASES: dict[str, tuple[dict[str, Any], Callable[[SemanticRouter, KvRouterTestDouble], dict[str, Any]], str | None]] = {
    "placement": ({}, _placement, "used"),
    "exact_wins": ({}, _exact_wins, "wasted"),
    "partial_exact": ({}, _partial_exact, "used"),
    "no_donor": ({}, _no_donor, "used"),
    "tenant_unknown": ({}, _tenant_unknown, None),
    "discovery_only": ({"discovery_only": True}, _placement, "used"),
    "overloaded": ({"placement_load_slack": 2}, _overloaded, "used"),
    "exact_query_raises": ({}, _exact_query_raises, "used"),
    "exact_answer_fails": ({}, _exact_answer_fails, "used"),
    "search_ahead_fails": ({}, _search_ahead_fails, "failed"),
    "exact_gate_fails": ({}, _exact_gate_fails, "failed"),
    "gate_unsure_placement": ({}, _gate_unsure(_placement), "used"),  # searched ahead: the usual span-path request
    "gate_unsure_exact_wins": ({}, _gate_unsure(_exact_wins), "wasted"),
}


@pytest.mark.parametrize("case", CASES)
async def test_every_decision_is_the_exact_first_orders(case: str) -> None:
    settings, arrange, counted = CASES[case]
    router, kv = _router(**settings)
    routed = router.parse(arrange(router, kv))
    ahead, first = await _both_orders(router, routed)
    assert _summary(ahead) == _summary(first)
    assert ("spans" in ahead.latency_us) == (counted is not None) and "spans" not in first.latency_us
    assert _searched_ahead(router) == {r: float(r == counted) for r in RESULTS}


async def test_nats_down_searches_nothing_ahead() -> None:
    router, kv = _router(link_cls=NatsLink)  # never started: disconnected
    routed = router.parse(_placement(router, kv))
    ahead, first = await _both_orders(router, routed)
    assert _summary(ahead) == _summary(first) and ahead.reason is DeclineReason.DONOR_NOT_RESIDENT
    assert "spans" not in ahead.latency_us and _searched_ahead(router) == dict.fromkeys(RESULTS, 0.0)


async def test_a_chain_is_planned_from_the_spans_found_ahead() -> None:
    router, _ = _chain_router()
    _make_resident_donor(router, CHAIN_DONOR, W1)
    ahead, first = await _both_orders(router, router.parse({"token_ids": CHAIN_RECIPIENT}))
    assert ahead.chain_steps and _summary(ahead) == _summary(first) and "spans" in ahead.latency_us


async def test_the_spans_are_searched_while_the_exact_query_is_in_flight() -> None:
    router, kv = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    assert router.discovery is not None
    loop = asyncio.get_running_loop()
    order: list[str] = []
    overlap: asyncio.Future[dict[str, Any]] = loop.create_future()

    def exact(token_ids: list[int], **_: Any) -> asyncio.Future[dict[str, Any]]:
        order.append("exact")  # asked: Dynamo's runtime starts the query when it is called
        return overlap

    search = router.discovery.find_spans

    def find_spans(*args: Any, **kwargs: Any) -> Any:
        order.append("spans, answered" if overlap.done() else "spans, in flight")
        return search(*args, **kwargs)

    kv.get_overlap_scores = exact  # type: ignore[method-assign]
    router.discovery.find_spans = find_spans  # type: ignore[method-assign]
    deciding = asyncio.ensure_future(router.decide(router.parse({"token_ids": _prompt((2, 1, 0))})))
    await asyncio.sleep(0)
    assert order == ["exact", "spans, in flight"] and not deciding.done()
    overlap.set_result({"workers": [{"worker_id": W2, "dp_rank": 0, "device_blocks": 0}]})
    decision = await deciding
    assert decision.outcome is Outcome.SEMANTIC_PLACEMENT and decision.allowed_worker == W1
    stages = decision.latency_us
    assert {"ask_loads", "exact", "spans", "semantic", "load", "decide"} <= stages.keys()
    assert stages["spans"] <= stages["exact"]  # the search is inside the exact query's time
    assert stages["ask_loads"] + stages["exact"] + stages["semantic"] + stages["load"] <= stages["decide"]


def _store(router: SemanticRouter, tokens: list[int], worker: int, **salting: Any) -> None:
    """``worker`` stores ``tokens``' blocks (no donor registered for them), hashed with ``salting``."""
    hashes = compute_block_hash_for_seq(tokens, BLOCK, **salting)
    stored = KvStored(block_hashes=[(1 << 40) + i for i in range(len(hashes))], tokens_hashes=hashes)
    router.on_kv_events(KvEventBatch(1, 0, 0, [KvEvent(worker_id=worker, event_id=7, data=stored)]))


@pytest.mark.parametrize(
    ("stored", "ahead"),
    [
        ("the blocks an exact win needs", False),
        ("another tenant's blocks", True),
        ("another LoRA's blocks", True),
        ("the first block only", True),
        ("the threshold block only", True),
        ("the two on different workers", True),
    ],
)
async def test_no_search_ahead_when_a_worker_stores_what_an_exact_win_needs(stored: str, ahead: bool) -> None:
    """An exact win needs one worker to hold the prompt's first block and the block that reaches the threshold
    (``exact_route_threshold`` 0.5: block 10 of a 320-token prompt of 16-token blocks), hashed as Dynamo's exact
    query hashes them (LoRA, cache salt)."""
    router, _ = _router()
    request = {"token_ids": _prompt((2, 1, 0)), "routing": {"lora_name": "a", "cache_namespace": "t"}}
    tokens = request["token_ids"]
    first, threshold = tokens[:BLOCK], tokens[9 * BLOCK : 10 * BLOCK]
    salting = {"lora_name": "a", "cache_namespace": "t"}
    if stored == "the blocks an exact win needs":
        _store(router, tokens[: 10 * BLOCK], W2, **salting)
    elif stored == "another tenant's blocks":
        _store(router, tokens, W2, lora_name="a", cache_namespace="u")
    elif stored == "another LoRA's blocks":
        _store(router, tokens, W2, cache_namespace="t")
    elif stored == "the first block only":
        _store(router, first, W2, **salting)
    elif stored == "the threshold block only":
        _store(router, threshold, W2, **salting)
    else:
        _store(router, first, W1, **salting)
        _store(router, threshold, W2, **salting)
    decision = await router.decide(router.parse(request))
    assert ("spans" in decision.latency_us) is ahead


@pytest.mark.parametrize(
    ("tokens", "threshold", "may_win"),
    [
        (320, 0.5, None),  # 10 blocks reach it: asked of the residency
        (328, 0.5, None),  # 164 tokens: 11 blocks
        (15, 0.5, False),  # no full block: Dynamo matches none
        (40, 0.9, False),  # 36 tokens needed, 2 full blocks
        (320, 0.0, True),  # every exact answer wins
    ],
)
def test_the_exact_win_gate_counts_blocks_as_the_decision_does(tokens: int, threshold: float, may_win: Any) -> None:
    router, _ = _router(exact_route_threshold=threshold)
    asked: list[list[int]] = []
    router.catalog.stored_together = lambda hashes: asked.append(list(hashes)) or False  # type: ignore[method-assign]
    routed = router.parse({"token_ids": list(range(100, 100 + tokens))})
    assert router._exact_may_win(routed) is (may_win if may_win is not None else False)
    if may_win is None:
        needed = -(-int(threshold * tokens) // BLOCK)
        blocks = compute_block_hash_for_seq(routed.tokens, BLOCK)
        assert asked == [[blocks[0], blocks[needed - 1]]]
    else:
        assert asked == []


async def test_with_the_setting_off_the_spans_are_searched_after_the_exact_answer() -> None:
    router, kv = _router(spans_during_exact=False)
    routed = router.parse(_placement(router, kv))
    decision = await router.decide(routed)
    assert decision.outcome is Outcome.SEMANTIC_PLACEMENT and "spans" not in decision.latency_us
    assert _searched_ahead(router) == dict.fromkeys(RESULTS, 0.0)
