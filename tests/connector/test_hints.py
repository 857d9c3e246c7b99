"""HintInbox: NATS-encoded hints, bounded and expiring, malformed ones counted."""

from __future__ import annotations

import msgpack

from semblend_dynamo.events.codec import encode
from semblend_dynamo.events.schemas import DonorHint, request_key
from trtllm_connector.hints import HintInbox

from .conftest import ManualClock


def _hint(key: str = "k1", donor: str = "0:1") -> DonorHint:
    return DonorHint(
        request_key=key, donor_id=donor, worker_id=0, namespace="ns", spans=[(0, 0, 64)], decision="semantic_placement"
    )


def test_take_returns_a_hint_once() -> None:
    inbox = HintInbox()
    hint = _hint()
    inbox.submit(hint)
    assert inbox.take("k1") == hint
    assert inbox.take("k1") is None


def test_an_enveloped_hint_is_taken_by_its_request_key() -> None:
    inbox = HintInbox()
    hint = _hint(request_key([1, 2, 3]))
    assert inbox.submit_bytes(encode(hint))
    assert inbox.take(request_key([1, 2, 3])) == hint


def test_malformed_hints_are_counted_and_dropped() -> None:
    inbox = HintInbox()
    envelope = msgpack.unpackb(encode(_hint()))
    envelope["payload"] = msgpack.packb({"schema": "semblend.hint/v1", "donor_id": 5})
    assert not inbox.submit_bytes(msgpack.packb(envelope))
    assert not inbox.submit_bytes(b"\x00garbage")
    assert not inbox.submit_bytes(encode(_hint())[:10])
    assert inbox.rejected["invalid_fields"] == 1 and sum(inbox.rejected.values()) == 3
    assert len(inbox) == 0


def test_capacity_and_ttl_are_enforced() -> None:
    clock = ManualClock()
    inbox = HintInbox(capacity=2, ttl_s=5.0, clock=clock)
    for i in range(3):
        inbox.submit(_hint(f"k{i}"))
    assert inbox.dropped["capacity"] == 1 and inbox.take("k0") is None
    clock.advance(6.0)
    assert inbox.take("k1") is None and inbox.dropped["expired"] == 2
