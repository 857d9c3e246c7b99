"""Router fault tolerance on stock ``dynamo.mocker --engine-type trtllm`` workers, a real nats-server and the real
Dynamo runtime (NATS event plane): replicas that start at different times converge, 10K hostile messages are all
counted, and a NATS restart during a request stream loses no request (a replica started while NATS is down still
serves). One cluster per module; tests run in file order, the NATS restart last.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import numpy as np
import pytest

from semblend_dynamo.events.codec import encode
from semblend_dynamo.events.schemas import DonorRegistration, OutcomeReport
from semblend_dynamo.outcomes import Outcome
from tests.router.cluster import Cluster, MockerHandle, Rag, RouterHandle, chunk, request_for, serve_donor, wait_until

pytestmark = [pytest.mark.nats, pytest.mark.dynamo]


@pytest.fixture(scope="module")
def workers(cluster: Cluster) -> tuple[MockerHandle, MockerHandle]:
    return cluster.start_mocker("m1"), cluster.start_mocker("m2")


@pytest.fixture(scope="module")
def router_a(cluster: Cluster, workers: tuple[MockerHandle, MockerHandle]) -> RouterHandle:
    router = cluster.start_router("router-a", max_message_bytes="65536")
    wait_until(lambda: router.health()["status"] == "ok")
    return router


def test_replicas_started_at_different_times_converge(cluster, workers, router_a) -> None:
    rag = Rag()
    serve_donor(cluster, router_a, rag.prompt((0, 1, 2), chunk(64)))
    router_b = cluster.start_router("router-b")
    wait_until(lambda: router_b.donors() == router_a.donors(), timeout=30)
    # New donors from either replica reach the other one.
    for router in (router_a, router_b):
        before = len(router_a.donors())
        (result,) = cluster.send([request_for(rag.prompt((2, 1, 0), chunk(64)))], instance=router.instance)
        assert result["ok"], result
        wait_until(
            lambda n=before + 1: len(router_a.donors()) == n and router_b.donors() == router_a.donors(), timeout=30
        )
    assert len(router_a.donors()) >= 3


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


def test_ten_thousand_fuzzed_messages_are_all_counted(cluster, workers, router_a) -> None:
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
    (result,) = cluster.send([request_for(chunk(96))])
    assert result["ok"], result


def test_nats_restart_during_a_request_stream_loses_no_request(cluster, workers, router_a) -> None:
    evidence_before = router_a.metric("semblend_router_events_out_total", kind="evidence")
    requests = [request_for(chunk(80)) for _ in range(30)]
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
    (direct,) = cluster.send([request_for(chunk(80))], instance=router_c.instance)
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
