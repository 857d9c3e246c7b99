"""NATS SIGKILLed and restarted mid-load: routing continues exact-only, then placements and evidence resume."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import msgpack
import nats
import pytest
from dynamo.llm import compute_block_hash_for_seq

from semblend_dynamo.events.codec import decode
from semblend_dynamo.events.schemas import RouteEvidence
from semblend_dynamo.outcomes import DeclineReason
from tests.adversarial.router_harness import BLOCK, MAX_BYTES, InProcessRouter, router_config
from tests.adversarial.test_router_twins import _prompt, _wait
from tests.router.test_handler import W2
from tests.support.nats import NatsServer

pytestmark = pytest.mark.nats

WAVE = 25


def _stored(hashes: list[int]) -> bytes:
    blocks = [{"block_hash": 9000 + i, "tokens_hash": h} for i, h in enumerate(hashes)]
    events = [{"worker_id": W2, "event": {"event_id": 1, "dp_rank": 0, "data": {"stored": {"blocks": blocks}}}}]
    return msgpack.packb({"topic": "kv-events", "payload": msgpack.packb(events)}, use_bin_type=True)


async def test_sigkill_and_restart_mid_load(nats_server: NatsServer) -> None:
    replica = await InProcessRouter(router_config(nats_server.url)).start()
    router = replica.router
    evidence: list[RouteEvidence] = []

    async def on_evidence(msg: Any) -> None:
        evidence.append(decode(msg.data, RouteEvidence, max_bytes=MAX_BYTES, deployment=replica.deployment))

    listener = await nats.connect(nats_server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
    await listener.subscribe(router.subjects.evidence, cb=on_evidence)
    await listener.flush()
    donor = _prompt((0, 1, 2))
    assert [out async for out in router.generate({"token_ids": donor})]
    await router.drain_registrations()
    await listener.publish(router.subjects.kv_events, _stored(compute_block_hash_for_seq(donor, BLOCK)))
    await _wait(lambda: any(router.catalog.is_resident(d["donor_id"]) for d in router.catalog.snapshot()), "donor")

    async def wave() -> list[dict[str, Any]]:
        """WAVE concurrent requests for reordered twins of the donor; the requests Dynamo was sent."""
        start = len(replica.kv.forwarded)
        outputs = await asyncio.gather(*(_collect(router, _prompt((2, 0, 1))) for _ in range(WAVE)))
        assert all(outputs) and len(outputs) == WAVE
        return replica.kv.forwarded[start:]

    before = await wave()
    await _wait(lambda: len(evidence) >= WAVE + 1, "evidence before the kill")
    assert all(_placed(sent) for sent in before)

    assert nats_server.proc is not None
    nats_server.proc.send_signal(signal.SIGKILL)
    nats_server.proc.wait()
    nats_server.proc = None
    await _wait(lambda: not replica.link.connected, "the router to see NATS gone")
    declines_before = router.metrics.declines.labels(DeclineReason.DONOR_NOT_RESIDENT.value)._value.get()
    during = await wave()
    assert not any(_placed(sent) or "semblend" in (sent.get("extra_args") or {}) for sent in during)
    assert router.metrics.declines.labels(DeclineReason.DONOR_NOT_RESIDENT.value)._value.get() == declines_before + WAVE
    received_during = len(evidence)
    sent_during = replica.publisher.sent[RouteEvidence.KIND]

    nats_server.start()
    await _wait(lambda: replica.link.connected, "the router to reconnect")
    await _wait(lambda: listener.is_connected, "the listener to reconnect")
    await replica.round_trip()
    await listener.flush()
    after = await wave()
    assert all(_placed(sent) for sent in after)  # the catalog survived: placements resume at once
    published = replica.publisher.sent
    await _wait(
        lambda: published[RouteEvidence.KIND] - sent_during >= 2 * WAVE, "evidence queued during the outage and after"
    )
    # Core NATS hands a message to whoever is subscribed when it arrives: the outage's evidence reaches this listener
    # only if it resubscribed before the router reconnected (usually, not always under load); the wave after does.
    await _wait(lambda: sum(e.outcome == "semantic_placement" for e in evidence[received_during:]) >= WAVE, "after")
    assert received_during == WAVE + 1  # nothing got through while NATS was dead
    assert sum(replica.publisher.dropped.values()) == 0
    await listener.close()
    await replica.close()


async def _collect(router: Any, tokens: list[int]) -> list[dict[str, Any]]:
    return [out async for out in router.generate({"token_ids": tokens})]


def _placed(sent: dict[str, Any]) -> bool:
    return bool((sent.get("routing") or {}).get("allowed_worker_ids"))
