"""The router's hint reaches a connector on the real path, on each event plane: nats-server, ``dynamo.frontend``
(OpenAI HTTP) -> the SemBlend router -> two ``dynamo.mocker --engine-type trtllm`` workers and a connector test
worker (tests/support/dynamo_connector_test_worker.py) that runs every request through the SemBlend connector in
its PyExecutor harness and publishes its KV blocks through Dynamo's own publisher.

A hint travels one way: the router publishes it on the donor worker's NATS hint subject before forwarding the
request; ``dynamo.trtllm`` hands TensorRT-LLM none of the request's ``extra_args`` (docs/router.md). The proof is in
the connector's own audit records: the reframed request's ``lookup`` and ``materialized`` records carry the router's
trace id, which only the hint carries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from semblend_dynamo.events.schemas import RouteEvidence
from semblend_dynamo.outcomes import Outcome
from tests.router.test_stock_graph import document
from tests.support.dynamo_connector_test_worker import STAND_IN_MODEL_CONFIG
from tests.support.dynamo_graph import MODEL, ConnectorTestWorker, DynamoGraph, EvidenceTap, Frontend, wait_until
from tests.support.nats import nats_binary

pytestmark = [pytest.mark.nats, pytest.mark.dynamo]

SHARED = {"rope_config": json.dumps(STAND_IN_MODEL_CONFIG)}
"""Settings the router and the connector must share: the namespace key carries the RoPE fingerprint."""
CONNECTOR = {"exact_materialization_only": "0", "isolation": "no_block_reuse"}
"""Shifted spans (a reframed document moves), isolated by running the engine without block reuse."""

SYSTEM_PROMPT = "You are a careful analyst of company filings. " * 8 + "Read the filing below.\n\n"
"""Served by the connector test worker before the test (about five blocks), so the donor is routed there."""


@dataclass
class HintGraph:
    graph: DynamoGraph
    frontend: Frontend
    worker: ConnectorTestWorker
    tap: EvidenceTap

    def send(self, prompt: str, **fields: Any) -> RouteEvidence:
        """One ``/v1/completions`` request (plus ``fields``) through the Frontend; the router's evidence for it."""
        seen = self.tap.count()
        self.frontend.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 2, **fields})
        return self.tap.next_after(seen)

    def records(self, trace_id: str | None, event: str) -> list[dict]:
        return [r for r in self.worker.audit() if r.get("trace_id") == trace_id and r["event"] == event]


@pytest.fixture(scope="module", params=["zmq", "nats"])
def hint_graph(request: pytest.FixtureRequest) -> Iterator[HintGraph]:
    if nats_binary() is None:
        pytest.fail("nats-server is missing: scripts/bootstrap.sh dev installs it")
    graph = DynamoGraph(request.param, name="h")
    tap = None
    try:
        for _ in range(2):
            graph.start_mocker()
        worker = graph.start_connector_worker(serve_first=SYSTEM_PROMPT, **SHARED, **CONNECTOR)
        graph.start_router(**SHARED)
        frontend = graph.start_frontend()
        tap = EvidenceTap(graph.nats.url, graph.evidence_subject())
        yield HintGraph(graph, frontend, worker, tap)
    finally:
        if tap is not None:
            tap.close()
        graph.close()


def test_the_routers_hint_reaches_the_connector_which_materializes(hint_graph: HintGraph) -> None:
    worker = hint_graph.worker
    doc = document(200, 300)
    # Dynamo's KV routing sends the donor where its system prompt is resident: the connector test worker.
    donor = hint_graph.send(SYSTEM_PROMPT + doc + "\n\nList the risks.")
    assert donor.worker_id == worker.worker_id and donor.hint is None
    wait_until(
        lambda: any(r["event"] == "donor_registered" for r in worker.audit()), what="the connector pinned the donor"
    )
    wait_until(
        lambda: any(
            d["worker_id"] == worker.worker_id and d["resident"] for d in hint_graph.graph.router_get("/debug/donors")
        ),
        what="the router sees the donor resident from the worker's KV events",
    )
    wait_until(
        lambda: hint_graph.graph.router_metric("semblend_router_indexer_backlog") == 0,
        what="the router's indexer applied the donor",
    )

    # The document moves to the front (a connector can only supply a prompt's prefix): every position shifts.
    reframed = hint_graph.send(doc + "\n\nTranslate the memo above for the board, keeping its figures.")
    assert reframed.outcome == Outcome.SEMANTIC_PLACEMENT, reframed.decline_reason
    assert reframed.hint is not None and reframed.hint.worker_id == worker.worker_id == reframed.worker_id
    trace = reframed.trace_id
    assert trace is not None and reframed.hint.trace_id == trace

    # generous: on a loaded 2-core machine the worker's audit line has been seen to take over 20 s
    [lookup] = wait_until(
        lambda: hint_graph.records(trace, "lookup"), timeout=60, what="the connector's lookup with the trace id"
    )
    assert lookup["role"] == "recipient" and lookup["found"] is True
    [materialized] = wait_until(
        lambda: hint_graph.records(trace, "materialized"), timeout=60, what="materialized with the trace"
    )
    assert materialized["role"] == "recipient" and materialized["worker_id"] == str(worker.worker_id)
    hinted_tokens = sum(length for _, _, length in reframed.hint.spans)
    assert 0 < materialized["materialized"] <= hinted_tokens
    assert materialized["requires_rope_correction"] is True  # the document moved: a shifted span
