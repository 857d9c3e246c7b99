"""A prefill chain through Dynamo's own parts: ``dynamo.frontend`` (OpenAI HTTP) -> the SemBlend router (shifted
mode, ``chain_enabled``) -> two ``dynamo.mocker --engine-type trtllm`` workers, NATS event plane.

The router's steps are observed from outside it: its hints on the workers' NATS hint subjects (one per request of the
chain, in order, each keyed by that request's own tokens), its ``RouteEvidence`` and its step counter; the
mocker's own prefix cache (``cached_tokens`` of the real request: the last step's prefix, found on the same worker).
The stock mocker does not salt its block hashes, so the salt of every request is asserted in test_handler.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from semblend_dynamo.events.schemas import DonorHint
from semblend_dynamo.outcomes import Outcome
from tests.router.test_stock_graph import document
from tests.support.dynamo_graph import DynamoGraph, EvidenceTap, Frontend, wait_until
from tests.support.nats import nats_binary

pytestmark = [pytest.mark.nats, pytest.mark.dynamo]

CHAIN = {
    "exact_materialization_only": "0",
    "isolation": "cache_salt",
    "chain_enabled": "1",
    "chain_step_overhead_tokens": "0",
}


@dataclass
class ChainGraph:
    graph: DynamoGraph
    frontend: Frontend
    evidence: EvidenceTap
    hints: EvidenceTap


@pytest.fixture(scope="module")
def chain_graph() -> Iterator[ChainGraph]:
    if nats_binary() is None:
        pytest.fail("nats-server is missing: scripts/bootstrap.sh dev installs it")
    graph = DynamoGraph("nats", name="chain")
    taps: list[EvidenceTap] = []
    try:
        for _ in range(2):
            graph.start_mocker(gpu_blocks=512)
        graph.start_router(**CHAIN)
        frontend = graph.start_frontend()
        taps.append(EvidenceTap(graph.nats.url, graph.evidence_subject()))
        taps.append(EvidenceTap(graph.nats.url, graph.hints_subject(), DonorHint))
        yield ChainGraph(graph, frontend, *taps)
    finally:
        for tap in taps:
            tap.close()
        graph.close()


def test_router_runs_the_chain_steps_on_the_donors_worker_before_the_request(chain_graph: ChainGraph) -> None:
    g = chain_graph
    doc = document(7, 350)
    seen = g.evidence.count()
    g.frontend.complete("You are a careful analyst. Read the filing below.\n\n" + doc + "\n\nList the risks.")
    donor = g.evidence.next_after(seen)
    assert donor.worker_id is not None
    wait_until(
        lambda: any(d["worker_id"] == donor.worker_id and d["resident"] for d in g.graph.router_get("/debug/donors")),
        what="donor resident from the mocker's KV events",
    )
    wait_until(
        lambda: g.graph.router_metric("semblend_router_indexer_backlog") == 0,
        what="the router's indexer applied the donor",
    )
    seen, hints_seen = g.evidence.count(), g.hints.count()
    response = g.frontend.complete("Translate the following memo for the board, keeping its figures.\n\n" + doc)
    recipient = g.evidence.next_after(seen)

    assert recipient.outcome == Outcome.SEMANTIC_PLACEMENT and recipient.decline_reason is None
    assert recipient.hint is not None and recipient.hint.role == "recipient" and recipient.hint.chain_head_tokens
    assert recipient.worker_id == donor.worker_id == recipient.hint.worker_id
    hints = wait_until(lambda: g.hints.records[hints_seen:] if g.hints.count() > hints_seen else None, what="hints")
    *steps, final = hints
    assert steps and [h.role for h in steps] == ["chain_step"] * len(steps)
    assert final == recipient.hint
    assert {h.worker_id for h in hints} == {donor.worker_id} and {h.trace_id for h in hints} == {recipient.trace_id}
    assert g.graph.router_metric("semblend_router_chain_steps_total", result="ok") == len(steps)
    # the mocker found the last step's prefix in its cache: the step ran on the same worker (its length: the last load's start)
    last_step_tokens = final.spans[0][1]
    cached = response["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= last_step_tokens, (cached, [h.model_dump() for h in hints])
