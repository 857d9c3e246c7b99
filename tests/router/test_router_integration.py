"""Router acceptance tests that need Dynamo *test workers* (tests/support/dynamo_test_worker.py), on a real
nats-server and the real Dynamo runtime.

A stock ``dynamo.mocker`` cannot do what these check: record the requests it receives (``routing.allowed_worker_ids``
delivered to the worker) and the hints arriving on its NATS hint subject, and publish blocks hashed
with the request's cache salt (the 1.6.1 mocker publishes unsalted hashes, so salted donors never become
resident). Everything a mocker can do runs on mockers: tests/router/test_stock_graph.py (Frontend, both event
planes, eviction by a real cache, a departing worker, the model card) and tests/router/test_router_faults.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from semblend_dynamo.events.schemas import request_key
from semblend_dynamo.outcomes import Outcome
from tests.router.cluster import (
    Cluster,
    Rag,
    RouterHandle,
    TestWorkerHandle,
    chunk,
    request_for,
    serve_donor,
    wait_until,
)

pytestmark = [pytest.mark.nats, pytest.mark.dynamo]


@pytest.fixture(scope="module")
def workers(cluster: Cluster) -> tuple[TestWorkerHandle, TestWorkerHandle]:
    return cluster.start_worker("w1"), cluster.start_worker("w2")


@pytest.fixture(scope="module")
def router_a(cluster: Cluster, workers: tuple[TestWorkerHandle, TestWorkerHandle]) -> RouterHandle:
    router = cluster.start_router("router-a", max_message_bytes="65536")
    wait_until(lambda: router.health()["status"] == "ok")
    return router


def _by_id(workers: tuple[TestWorkerHandle, ...], worker_id: int) -> TestWorkerHandle:
    return next(w for w in workers if w.worker_id == worker_id)


def _hint_for(worker: TestWorkerHandle, tokens: list[int], *, expected: bool) -> dict[str, Any] | None:
    """The router hint for ``tokens`` that arrived on the worker's NATS hint subject (None: no hint).

    The router publishes a hint before it forwards the request; an ``expected`` one is waited for (NATS and the
    request plane are separate connections).
    """
    if not any(request["token_ids"] == tokens for request in worker.received()):
        raise AssertionError("the worker never received this request")
    key = request_key(tokens)

    def find() -> dict[str, Any] | None:
        return next((hint for hint in reversed(worker.hints()) if hint.get("request_key") == key), None)

    return wait_until(find, timeout=5) if expected else find()


def test_reordered_rag_request_goes_to_the_donor_worker_with_a_hint(cluster, workers, router_a) -> None:
    rag = Rag()
    donor = rag.prompt((0, 1, 2), chunk(64))
    donor_worker = serve_donor(cluster, router_a, donor)
    other = next(w.worker_id for w in workers if w.worker_id != donor_worker)
    targets = [rag.prompt(order, chunk(64)) for order in [(2, 0, 1), (1, 2, 0), (2, 1, 0)]]
    results = cluster.send([request_for(t) for t in targets])
    assert [r["ok"] for r in results] == [True] * 3
    assert {r["worker_id"] for r in results} == {donor_worker}, f"expected all on {donor_worker}, other is {other}"
    holder = _by_id(workers, donor_worker)
    for target in targets:
        hint = _hint_for(holder, target, expected=True)
        assert hint is not None and hint["schema"] == "semblend.hint/v1"
        assert hint["decision"] == Outcome.SEMANTIC_PLACEMENT.value
        assert hint["worker_id"] == donor_worker and hint["spans"], hint
        request = next(r for r in holder.received() if r["token_ids"] == target)
        assert request["routing"]["allowed_worker_ids"] == [donor_worker]
    assert router_a.metric("semblend_router_decisions_total", outcome="semantic_placement") >= 3


def test_identical_content_never_places_across_tenants(cluster, workers, router_a) -> None:
    rag = Rag()
    donor_worker = serve_donor(cluster, router_a, rag.prompt((0, 1, 2), chunk(64)), tenant="tenantA")
    target = rag.prompt((2, 0, 1), chunk(64))
    (cross,) = cluster.send([request_for(target, tenant="tenantB")])
    assert cross["ok"], cross
    assert _hint_for(_by_id(workers, int(cross["worker_id"])), target, expected=False) is None
    (same,) = cluster.send([request_for(rag.prompt((1, 2, 0), chunk(64)), tenant="tenantA")])
    assert same["ok"] and same["worker_id"] == donor_worker
    namespaces = {d["namespace"] for d in router_a.donors()}
    assert len(namespaces) >= 2  # tenant A's donors live under their own namespace digest
