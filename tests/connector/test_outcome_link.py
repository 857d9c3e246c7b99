"""The connector's NATS link against a real nats-server: outcomes and lifecycle out, hints in."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from semblend_dynamo.events.codec import decode, encode
from semblend_dynamo.events.schemas import DonorHint, DonorLifecycle, OutcomeReport, request_key
from semblend_dynamo.events.subjects import Subjects

from .conftest import prompt

pytestmark = pytest.mark.nats


async def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting on NATS")
        await asyncio.sleep(0.02)


async def test_outcomes_lifecycle_and_hints_travel_over_nats(make_harness, nats_server) -> None:
    h = make_harness(connector_nats=True, nats_url=nats_server.url, worker_id=7, pin_budget_fraction=0.3)
    link = h.scheduler.link
    assert link is not None and link.connected.wait(30)
    subjects = Subjects.for_config(h.scheduler.cfg)
    nc = await nats.connect(nats_server.url)
    outcomes: list[OutcomeReport] = []
    lifecycle: list[DonorLifecycle] = []

    async def on_outcome(msg) -> None:
        outcomes.append(decode(msg.data, OutcomeReport, max_bytes=1 << 20))

    async def on_donor(msg) -> None:
        lifecycle.append(decode(msg.data, DonorLifecycle, max_bytes=1 << 20))

    await nc.subscribe(subjects.outcomes, cb=on_outcome)
    await nc.subscribe(subjects.donors, cb=on_donor)
    await nc.flush()

    donor = prompt(90, 100)
    d = h.run_request(donor)
    target = donor[:72] + prompt(91, 30)
    hint = DonorHint(
        request_key=request_key(target),
        donor_id=h.scheduler.registry.donor_id_for(d.request_id),
        worker_id=7,
        namespace=h.scheduler.model.namespace().digest(),
        decision="semantic_placement",
    )
    await nc.publish(subjects.hints(7), encode(hint))
    await nc.flush()
    await _wait_for(lambda: len(h.scheduler.hints) == 1)
    r = h.run_request(target)
    assert r.promised == 72
    await _wait_for(lambda: len(outcomes) >= 2 and len(lifecycle) >= 2)
    await nc.close()
    link.close()

    by_request = {o.request_id: o for o in outcomes}
    assert {str(d.request_id), str(r.request_id)} <= set(by_request), (outcomes, lifecycle, link.dropped)
    assert by_request[str(d.request_id)].outcome == "backend_declined"
    assert by_request[str(d.request_id)].rejection_reason == "no_candidate"
    done = by_request[str(r.request_id)]
    assert done.outcome == "backend_materialized" and done.materialized_tokens == 72
    assert done.request_key == request_key(target) and done.worker_id == 7
    assert [e.event for e in lifecycle[:2]] == ["pinned", "pinned"]
    assert lifecycle[0].donor_id == hint.donor_id
    assert link.dropped == {}


def test_link_without_a_server_drops_and_counts(make_harness) -> None:
    h = make_harness(connector_nats=True, nats_url="nats://127.0.0.1:9", worker_id=3)
    h.run_request(prompt(92, 40))
    link = h.scheduler.link
    link.close()
    assert not link.connected.is_set()
    assert sum(link.dropped.values()) >= 1
