"""Acceptance tests of the router on a real nats-server and the real Dynamo runtime (issue 3).

One cluster per module: a nats-server on a free loopback port, two test workers and router replica A,
all subprocesses. Tests run in file order and build on each other's state where noted; the NATS
restart test runs last.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from semblend_dynamo.events.codec import encode
from semblend_dynamo.events.schemas import DonorRegistration, OutcomeReport
from semblend_dynamo.outcomes import Outcome
from tests.router.cluster import Cluster, RouterHandle, TestWorkerHandle, wait_until
from tests.support.nats import nats_binary

pytestmark = [pytest.mark.nats, pytest.mark.dynamo]

RNG = random.Random(20261121)


def _chunk(n: int) -> list[int]:
    return [RNG.randrange(100, 7000) for _ in range(n)]


class Rag:
    """A retrieval-augmented prompt family: system prompt + documents + question, reorderable."""

    def __init__(self) -> None:
        self.docs = [_chunk(128) for _ in range(3)]
        self.question = _chunk(32)

    def prompt(self, order: tuple[int, ...], system: list[int]) -> list[int]:
        return system + [t for i in order for t in self.docs[i]] + self.question


def _request(tokens: list[int], tenant: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"token_ids": tokens, "stop_conditions": {"max_tokens": 2}}
    if tenant is not None:  # the stock frontend passes the salt to backends as extra_args.nvext.cache_salt
        request["extra_args"] = {"nvext": {"cache_salt": tenant}}
    return request


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if nats_binary() is None:
        pytest.fail("nats-server is missing: scripts/bootstrap.sh dev installs it")
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


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


def _hint_for(worker: TestWorkerHandle, tokens: list[int]) -> dict[str, Any] | None:
    """The semblend hint the worker received with the request for ``tokens`` (None: no hint)."""
    for request in reversed(worker.received()):
        if request["token_ids"] == tokens:
            return (request.get("extra_args") or {}).get("semblend")
    raise AssertionError("the worker never received this request")


def _resident(router: RouterHandle, worker_id: int) -> int:
    return sum(1 for d in router.donors() if d["resident"] and d["worker_id"] == worker_id)


def _serve_donor(cluster: Cluster, router: RouterHandle, tokens: list[int], tenant: str | None = None) -> int:
    """Send a prompt through the router and wait until it is a resident donor; returns the serving worker."""
    before = {d["donor_id"] for d in router.donors()}
    (result,) = cluster.send([_request(tokens, tenant)])
    assert result["ok"], result
    worker_id = int(result["worker_id"])
    wait_until(lambda: any(d["resident"] and d["donor_id"] not in before for d in router.donors()))
    return worker_id


STATE: dict[str, Any] = {}


def test_a_reordered_rag_request_goes_to_the_donor_worker_with_a_hint(cluster, workers, router_a) -> None:
    rag = Rag()
    donor = rag.prompt((0, 1, 2), _chunk(64))
    donor_worker = _serve_donor(cluster, router_a, donor)
    other = next(w.worker_id for w in workers if w.worker_id != donor_worker)
    targets = [rag.prompt(order, _chunk(64)) for order in [(2, 0, 1), (1, 2, 0), (2, 1, 0)]]
    results = cluster.send([_request(t) for t in targets])
    assert [r["ok"] for r in results] == [True] * 3
    assert {r["worker_id"] for r in results} == {donor_worker}, f"expected all on {donor_worker}, other is {other}"
    holder = _by_id(workers, donor_worker)
    for target in targets:
        hint = _hint_for(holder, target)
        assert hint is not None and hint["schema"] == "semblend.hint/v1"
        assert hint["decision"] == Outcome.SEMANTIC_PLACEMENT.value
        assert hint["worker_id"] == donor_worker and hint["spans"], hint
        request = next(r for r in holder.received() if r["token_ids"] == target)
        assert request["routing"]["allowed_worker_ids"] == [donor_worker]
    assert router_a.metric("semblend_router_decisions_total", outcome="semantic_placement") >= 3
    STATE.update(rag=rag, donor_worker=donor_worker)


def test_b_evicted_donor_no_longer_places(cluster, workers, router_a) -> None:
    rag, donor_worker = STATE["rag"], STATE["donor_worker"]
    holder = _by_id(workers, donor_worker)
    assert _resident(router_a, donor_worker) > 0
    assert holder.command("evict_all")["evicted"] > 0
    wait_until(lambda: _resident(router_a, donor_worker) == 0)
    assert all(not d["resident"] for d in router_a.donors() if d["worker_id"] == donor_worker)
    target = rag.prompt((1, 0, 2), _chunk(64))
    (result,) = cluster.send([_request(target)])
    assert result["ok"], result
    assert _hint_for(_by_id(workers, int(result["worker_id"])), target) is None


def test_c_replicas_started_at_different_times_converge(cluster, workers, router_a) -> None:
    rag = Rag()
    _serve_donor(cluster, router_a, rag.prompt((0, 1, 2), _chunk(64)))
    router_b = cluster.start_router("router-b")
    STATE["router_b"] = router_b
    wait_until(lambda: router_b.donors() == router_a.donors(), timeout=30)
    # New donors from either replica reach the other one.
    for router in (router_a, router_b):
        before = len(router_a.donors())
        (result,) = cluster.send([_request(rag.prompt((2, 1, 0), _chunk(64)))], instance=router.instance)
        assert result["ok"], result
        wait_until(
            lambda n=before + 1: len(router_a.donors()) == n and router_b.donors() == router_a.donors(), timeout=30
        )
    assert len(router_a.donors()) >= 3


def test_d_identical_content_never_places_across_tenants(cluster, workers, router_a) -> None:
    rag = Rag()
    donor_worker = _serve_donor(cluster, router_a, rag.prompt((0, 1, 2), _chunk(64)), tenant="tenantA")
    target = rag.prompt((2, 0, 1), _chunk(64))
    (cross,) = cluster.send([_request(target, tenant="tenantB")])
    assert cross["ok"], cross
    assert _hint_for(_by_id(workers, int(cross["worker_id"])), target) is None
    (same,) = cluster.send([_request(rag.prompt((1, 2, 0), _chunk(64)), tenant="tenantA")])
    assert same["ok"] and same["worker_id"] == donor_worker
    namespaces = {d["namespace"] for d in router_a.donors()}
    assert len(namespaces) >= 2  # tenant A's donors live under their own namespace digest


def _fuzz_messages(cluster: Cluster, n: int) -> list[tuple[str, bytes]]:
    """Random bytes, truncations, bit flips, foreign topics/versions/deployments and oversized messages."""
    rng = np.random.default_rng(7)
    registration = DonorRegistration(
        donor_id="fuzz",
        worker_id=1,
        deployment="0" * 16,
        namespace="0" * 16,
        num_tokens=32,
        block_size=16,
        block_hashes=[1, 2],
        embedding=b"",
        embedding_dim=0,
    )
    outcome = OutcomeReport(
        request_id="r", request_key="k", worker_id=1, deployment="0" * 16, namespace="n", outcome=Outcome.COLD_FALLBACK
    )
    kv = msgpack.packb(
        {
            "publisher_id": 1,
            "sequence": 0,
            "published_at": 0,
            "topic": "kv-events",
            "payload": msgpack.packb(
                [{"worker_id": 5, "event": {"event_id": 1, "data": {"removed": {"block_hashes": [9]}}, "dp_rank": 0}}]
            ),
        }
    )
    seeds = {
        cluster.subject("kv-events"): kv,
        cluster.subject("semblend.donors"): encode(registration),
        cluster.subject("semblend.outcomes"): encode(outcome),
    }
    subjects = list(seeds)
    out = []
    for i in range(n):
        subject = subjects[i % 3]
        seed = bytearray(seeds[subjects[(i // 3) % 3]])
        kind = i % 5
        if kind == 0:
            data = rng.bytes(int(rng.integers(0, 400)))
        elif kind == 1:
            data = bytes(seed[: int(rng.integers(0, len(seed)))])
        elif kind == 2:
            for _ in range(int(rng.integers(1, 4))):
                seed[int(rng.integers(0, len(seed)))] ^= 1 << int(rng.integers(0, 8))
            data = bytes(seed)
        elif kind == 3:
            data = bytes(seed)  # valid on its own subject, wrong topic/deployment elsewhere
        else:
            data = bytes(seed) + rng.bytes(70_000) if i % 50 == 4 else bytes(seed[::-1])
        out.append((subject, data))
    return out


STREAMS = ("kv_events", "donors", "outcomes")


def _counted(router: RouterHandle) -> float:
    return sum(
        router.metric("semblend_router_events_in_total", stream=s)
        + router.metric("semblend_router_events_rejected_total", stream=s)
        for s in STREAMS
    )


def test_f_ten_thousand_fuzzed_messages_are_all_counted(cluster, workers, router_a) -> None:
    before = _counted(router_a)
    rejected_before = router_a.metric("semblend_router_events_rejected_total")
    cluster.publish_raw(_fuzz_messages(cluster, 10_000))
    wait_until(lambda: _counted(router_a) - before >= 10_000, timeout=60)
    time.sleep(0.5)
    assert _counted(router_a) - before == 10_000
    assert router_a.metric("semblend_router_events_rejected_total") - rejected_before > 5_000
    for reason in ("malformed", "truncated", "oversized", "wrong_topic", "wrong_namespace"):
        assert router_a.metric("semblend_router_events_rejected_total", reason=reason) > 0, reason
    assert router_a.proc.proc.poll() is None
    assert router_a.health()["status"] == "ok"
    (result,) = cluster.send([_request(_chunk(96))])
    assert result["ok"], result


def test_e_nats_restart_during_a_request_stream_loses_no_request(cluster, workers, router_a) -> None:
    evidence_before = router_a.metric("semblend_router_events_out_total", kind="evidence")
    requests = [_request(_chunk(80)) for _ in range(30)]
    results: list[dict[str, Any]] = []
    sender = threading.Thread(
        target=lambda: results.extend(cluster.send(requests, interval_s=0.15, instance=router_a.instance))
    )
    sender.start()
    time.sleep(1.0)
    cluster.nats.stop()
    wait_until(lambda: router_a.health()["status"] == "degraded", timeout=10)
    # NATS down at start: a new replica still starts, serves and reports degraded health.
    router_c = cluster.start_router("router-c")
    health_c = router_c.health()
    assert health_c["serving"] and health_c["status"] == "degraded" and health_c["event_plane"] == "zmq"
    (direct,) = cluster.send([_request(_chunk(80))], instance=router_c.instance)
    assert direct["ok"], direct
    evidence_during = router_a.metric("semblend_router_events_out_total", kind="evidence")
    cluster.nats.start()
    sender.join(timeout=120)
    assert len(results) == len(requests)
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]]
    wait_until(lambda: router_a.health()["status"] == "ok", timeout=20)
    wait_until(
        lambda: router_a.metric("semblend_router_events_out_total", kind="evidence") > evidence_during, timeout=20
    )
    assert router_a.metric("semblend_router_events_out_total", kind="evidence") >= evidence_before + len(requests)
    wait_until(lambda: router_c.health()["nats_connected"], timeout=20)


def test_g_a_departed_worker_takes_its_donors_with_it(cluster, workers, router_a) -> None:
    _serve_donor(cluster, router_a, Rag().prompt((0, 1, 2), _chunk(64)))
    leaving = next(w for w in workers if any(d["worker_id"] == w.worker_id for d in router_a.donors()))
    staying = next(w for w in workers if w is not leaving)
    kept = [d for d in router_a.donors() if d["worker_id"] == staying.worker_id]
    leaving.proc.stop()
    wait_until(lambda: all(d["worker_id"] != leaving.worker_id for d in router_a.donors()), timeout=30)
    assert [d for d in router_a.donors() if d["worker_id"] == staying.worker_id] == kept


def test_h_router_registers_a_model_card_a_frontend_can_discover(cluster, router_a) -> None:
    """The Frontend serves the model cards it discovers: the router must publish one for its own endpoint."""
    mdc = cluster.dir / "filekv" / "v1" / "mdc"
    prefix = f"{cluster.namespace}%2Fsemblend%2Fgenerate%2F"

    def router_cards() -> list[Path]:
        return [p for p in mdc.rglob("*") if p.is_file() and prefix in p.name] if mdc.exists() else []

    wait_until(lambda: any(f"{router_a.instance:x}" in p.name for p in router_cards()))
    # one card per router replica that is up (test c starts a second one)
    card = next(p for p in router_cards() if f"{router_a.instance:x}" in p.name)
    assert "test-model" in json.dumps(json.loads(card.read_text()))
