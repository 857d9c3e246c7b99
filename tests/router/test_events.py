"""Event schemas, codec and subjects: round trips, rejections with reasons, Dynamo kv-events decoding."""

from __future__ import annotations

import array
import asyncio
import contextlib

import msgpack
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.codec import REJECT_REASONS, RejectedMessage, decode, decode_kv_events, encode, topic_of
from semblend_dynamo.events.schemas import (
    DonorHint,
    DonorLifecycle,
    DonorRegistration,
    DonorSyncPage,
    DonorSyncRequest,
    KvCleared,
    KvRemoved,
    KvStored,
    OutcomeReport,
    RouteEvidence,
    deployment_digest,
    recipient_hint,
    request_key,
)
from semblend_dynamo.events.subjects import Subjects
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.outcomes import DeclineReason, Outcome

KEY = NamespaceKey(model_id="m", tokens_per_block=16, cache_salt="tenantA")
DEPLOY = deployment_digest(KEY)
MAX = 1 << 20


def _hint() -> DonorHint:
    return DonorHint(
        request_key=request_key([1, 2, 3]),
        donor_id="d1",
        worker_id=(1 << 64) - 1,
        dp_rank=1,
        namespace=KEY.digest(),
        similarity=0.875,
        spans=[(0, 32, 64), (64, 0, 32)],
        decision=Outcome.SEMANTIC_PLACEMENT,
    )


def _registration() -> DonorRegistration:
    emb, dim = DonorRegistration.pack_embedding(np.linspace(-1, 1, 384, dtype=np.float32))
    return DonorRegistration(
        donor_id="d1",
        worker_id=7,
        deployment=DEPLOY,
        namespace=KEY.digest(),
        num_tokens=100,
        block_size=16,
        block_hashes=[1, (1 << 64) - 1, 3],
        embedding=emb,
        embedding_dim=dim,
    )


def _all_models() -> list:
    return [
        _hint(),
        RouteEvidence(
            request_id="r1",
            request_key="ab",
            deployment=DEPLOY,
            namespace=KEY.digest(),
            outcome=Outcome.SEMANTIC_PLACEMENT,
            worker_id=3,
            prompt_tokens=100,
            exact_overlap_blocks=2,
            hint=_hint(),
            stage_latency_us={"exact": 12.5, "semantic": 300.0},
        ),
        _registration(),
        DonorLifecycle(
            donor_id="d1", worker_id=3, deployment=DEPLOY, namespace=KEY.digest(), event="evicted", generation=2
        ),
        OutcomeReport(
            request_id="r1",
            request_key="ab",
            worker_id=3,
            deployment=DEPLOY,
            namespace=KEY.digest(),
            outcome=Outcome.BACKEND_DECLINED,
            rejection_reason=DeclineReason.DONOR_EVICTED,
            donor_id="d1",
        ),
        DonorSyncRequest(router_id="r1", deployment=DEPLOY, target="r2", after=5, upto=9),
        DonorSyncPage.of(
            [_registration()], router_id="r2", deployment=DEPLOY, after=5, upto=9, next_cursor=6, last_cursor=9
        ),
    ]


@pytest.mark.parametrize("model", _all_models(), ids=lambda m: type(m).__name__)
def test_every_model_round_trips_through_the_envelope(model) -> None:
    data = encode(model, publisher_id=9, sequence=4)
    env = msgpack.unpackb(data)
    assert set(env) == {"publisher_id", "sequence", "published_at", "topic", "payload"}
    assert (env["publisher_id"], env["sequence"]) == (9, 4)
    assert msgpack.unpackb(env["payload"])["schema"] == f"semblend.{model.KIND}/v{model.VERSION}"
    assert decode(data, type(model), max_bytes=MAX) == model


def _reference_encoding(model, publisher_id: int, sequence: int, published_at_ms: int) -> bytes:
    """The envelope as ``encode`` built it for every model: ``model_dump`` by alias, each map packed by ``packb``."""
    payload = msgpack.packb(model.model_dump(mode="python", by_alias=True), use_bin_type=True)
    envelope = {
        "publisher_id": publisher_id,
        "sequence": sequence,
        "published_at": published_at_ms,
        "topic": topic_of(model),
        "payload": payload,
    }
    return msgpack.packb(envelope, use_bin_type=True)


@pytest.mark.parametrize("model", _all_models(), ids=lambda m: type(m).__name__)
def test_every_model_encodes_to_the_bytes_of_its_model_dump(model) -> None:
    assert encode(model, publisher_id=9, sequence=4, published_at_ms=77) == _reference_encoding(model, 9, 4, 77)


@settings(max_examples=300, deadline=None)
@given(
    donor_key=st.none() | st.text(min_size=1, max_size=64),
    request_id=st.none() | st.text(max_size=40),
    worker_id=st.integers(0, (1 << 64) - 1),
    dp_rank=st.integers(0, (1 << 32) - 1),
    similarity=st.none() | st.floats(-1.0, 1.0),
    spans=st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(1, 1 << 20)), max_size=40),
    decision=st.sampled_from(list(Outcome)),
    trace_id=st.none() | st.text(min_size=1, max_size=64),
    role=st.sampled_from(["recipient", "chain_step", "donor_prefill", None]),
    chain_head_tokens=st.none() | st.integers(0, 1 << 20),
    decoded=st.booleans(),
)
def test_a_hint_encodes_to_the_bytes_of_its_model_dump(
    donor_key, request_id, worker_id, dp_rank, similarity, spans, decision, trace_id, role, chain_head_tokens, decoded
) -> None:
    """The hint's payload is packed from its fields' values (the request path's encoding): the same bytes as the
    ``model_dump`` path, for any hint, built or decoded, its defaults (``role``) included."""
    extra = {} if role is None else {"role": role}
    hint = DonorHint(
        request_key=request_key([1, 2, 3]),
        request_id=request_id,
        donor_id="d1",
        donor_key=donor_key,
        worker_id=worker_id,
        dp_rank=dp_rank,
        namespace=KEY.digest(),
        similarity=similarity,
        spans=spans,
        decision=decision,
        trace_id=trace_id,
        chain_head_tokens=chain_head_tokens,
        **extra,
    )
    if decoded:
        hint = decode(encode(hint), DonorHint, max_bytes=MAX)
    assert encode(hint, publisher_id=worker_id, sequence=dp_rank, published_at_ms=5) == _reference_encoding(
        hint, worker_id, dp_rank, 5
    )


def _any_text(shortest: int, longest: int) -> st.SearchStrategy:
    """Text a hint's string field may get: ASCII, any unicode (surrogates too), just past its bounds, a str subclass."""
    return (
        st.text(st.characters(max_codepoint=127), min_size=shortest, max_size=longest)
        | st.text(min_size=max(0, shortest - 1), max_size=longest + 2)
        | st.sampled_from(["", "x" * longest, "x" * (longest + 1), "\ud800", "é"]).map(str)
        | st.sampled_from([Outcome.EXACT_PREFIX_ROUTE, 7, None])
    )


def _any_int(bits: int) -> st.SearchStrategy:
    """An int field's value: in range, at and just past its bounds, or of another type."""
    return (
        st.integers(-2, (1 << bits) + 1)
        | st.sampled_from([-1, 0, (1 << bits) - 1, 1 << bits])
        | st.sampled_from([True, False, 3.0, np.int64(3), np.uint64(5), "4"])
    )


_SPAN_PART = st.integers(-1, 1 << 40) | st.sampled_from([True, np.int64(2), 2.0, 0])
_ANY_SPAN = st.tuples(_SPAN_PART, _SPAN_PART, _SPAN_PART) | st.lists(st.integers(0, 9), max_size=4).map(
    lambda x: x if len(x) != 3 else tuple(x)
)


def _same_as_validated(fields: dict) -> bool:
    """``recipient_hint(**fields)`` gives what ``DonorHint(**fields)`` gives: the same refusal, or a hint of the same
    fields in the same order, of the same types, with the same fields set, the same bytes on the wire. Whether it
    skipped the validation (it keeps the caller's list of spans then; validation copies it)."""
    try:
        expected = DonorHint(**fields)
    except ValidationError as exc:
        with pytest.raises(ValidationError) as refused:
            recipient_hint(**fields)
        assert refused.value.errors() == exc.errors()
        return False
    hint = recipient_hint(**fields)
    assert type(hint) is DonorHint
    got = hint.__dict__
    assert got.pop("issued_at") == pytest.approx(expected.__dict__.pop("issued_at"), abs=5.0)
    assert list(got) == list(expected.__dict__)
    for name, value in expected.__dict__.items():
        assert type(got[name]) is type(value), name
        if name == "spans":
            assert [tuple(map(type, s)) for s in got[name]] == [tuple(map(type, s)) for s in value]
    assert got == expected.__dict__
    assert hint.__pydantic_fields_set__ == expected.__pydantic_fields_set__
    assert type(hint.__pydantic_fields_set__) is set
    assert (hint.__pydantic_extra__, hint.__pydantic_private__) == (expected.__pydantic_extra__, None)
    got["issued_at"] = expected.__dict__["issued_at"] = 1.5
    assert hint == expected
    assert encode(hint, publisher_id=3, sequence=4, published_at_ms=5) == encode(
        expected, publisher_id=3, sequence=4, published_at_ms=5
    )
    assert hint.model_copy(update={"worker_id": 9}).model_fields_set == expected.model_fields_set
    return got["spans"] is fields["spans"]


def _copied_spans(fields: dict) -> dict:
    """A sampled list of spans is one object across examples: each example gets its own (the fast path keeps it)."""
    spans = fields["spans"]
    return {**fields, "spans": list(spans) if isinstance(spans, list) else spans}


_ANY = {
    "request_key": _any_text(1, 64),
    "request_id": st.none() | _any_text(0, 256),
    "donor_id": _any_text(1, 256),
    "donor_key": st.none() | _any_text(1, 64),
    "worker_id": _any_int(64),
    "dp_rank": _any_int(32),
    "namespace": _any_text(1, 64),
    "similarity": st.none()
    | st.floats(-1.01, 1.01)
    | st.floats(allow_nan=True)
    | st.sampled_from([1, 0, True, np.float32(0.5), np.float64(0.25), -1.0, 1.0]),
    "spans": st.lists(
        st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(1, 1 << 20)) | _ANY_SPAN,
        max_size=6,
    )
    | st.sampled_from([(), [(0, 1, 2)] * 4097, [(0, 1, 2)] * 4096]),
    "decision": st.sampled_from([*Outcome, "semantic_placement", "nonsense", 3]),
    "trace_id": st.none() | _any_text(1, 64),
}

_ANY_FIELDS = st.fixed_dictionaries(_ANY).map(_copied_spans)

_ASCII = st.characters(max_codepoint=127)

_ROUTERS_FIELDS = st.fixed_dictionaries(
    {
        "request_key": st.text(_ASCII, min_size=1, max_size=64),
        "request_id": st.none() | st.text(_ASCII, max_size=256),
        "donor_id": st.text(_ASCII, min_size=1, max_size=256),
        "donor_key": st.none() | st.text(_ASCII, min_size=1, max_size=64),
        "worker_id": st.integers(0, (1 << 64) - 1),
        "dp_rank": st.integers(0, (1 << 32) - 1),
        "namespace": st.text(_ASCII, min_size=1, max_size=64),
        "similarity": st.none() | st.floats(-1.0, 1.0),
        "spans": st.lists(
            st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(1, 1 << 20)), max_size=40
        ),
        "decision": st.sampled_from(list(Outcome)),
        "trace_id": st.none() | st.text(_ASCII, min_size=1, max_size=64),
    }
)


@settings(max_examples=1500, deadline=None)
@given(fields=_ANY_FIELDS)
def test_a_recipient_hint_of_any_fields_is_the_validated_hint(fields: dict) -> None:
    """Fields in and out of the schema's bounds, of other types (validation converts them or refuses)."""
    _same_as_validated(fields)


@settings(max_examples=1500, deadline=None)
@given(fields=_ROUTERS_FIELDS, name=st.sampled_from(sorted(_ANY)), data=st.data())
def test_a_recipient_hint_with_one_odd_field_is_the_validated_hint(
    fields: dict, name: str, data: st.DataObject
) -> None:
    """The router's fields but one, of any value: each field's own bounds and types decide (with every field odd at
    once, a value just past one bound mostly meets another field that sends the hint through validation anyway)."""
    _same_as_validated(_copied_spans({**fields, name: data.draw(_ANY[name])}))


@settings(max_examples=500, deadline=None)
@given(fields=_ROUTERS_FIELDS)
def test_a_recipient_hint_of_the_routers_fields_skips_the_validation(fields: dict) -> None:
    """Fields of the router's types within the schema's bounds: the same hint, made without the validation."""
    assert _same_as_validated(fields)


def test_embedding_travels_as_float16_bytes() -> None:
    reg = _registration()
    assert len(reg.embedding) == 2 * 384
    back = decode(encode(reg), DonorRegistration, max_bytes=MAX).vector()
    np.testing.assert_allclose(back, np.linspace(-1, 1, 384), atol=1e-3)


def test_request_key_is_xxh3_of_little_endian_u32_tokens() -> None:
    tokens = [0, 1, 65535, (1 << 32) - 1]
    raw = b"".join(t.to_bytes(4, "little") for t in tokens)
    assert request_key(tokens) == xxhash.xxh3_64_hexdigest(raw)
    assert request_key(array.array("I", tokens)) == request_key(tokens)  # the connector's u32 buffer, not copied
    assert request_key(array.array("q", tokens)) == request_key(tokens)  # another buffer type is converted
    assert request_key(tokens) != request_key(tokens[::-1])
    with pytest.raises(ValueError):
        request_key([-1])
    with pytest.raises(ValueError):
        request_key([1 << 32])


def test_union_decode_dispatches_on_schema() -> None:
    lifecycle = _all_models()[3]
    registration = _registration()
    both = (DonorRegistration, DonorLifecycle)
    assert decode(encode(lifecycle), both, max_bytes=MAX) == lifecycle
    assert decode(encode(registration), both, max_bytes=MAX) == registration


def _reason(data: bytes, expected=DonorRegistration, **kw) -> str:
    with pytest.raises(RejectedMessage) as info:
        decode(data, expected, max_bytes=kw.pop("max_bytes", MAX), **kw)
    assert info.value.reason in REJECT_REASONS
    return info.value.reason


def _with_payload(payload: dict, topic: str = "semblend.donors") -> bytes:
    env = {"publisher_id": 1, "sequence": 0, "published_at": 0, "topic": topic, "payload": msgpack.packb(payload)}
    return msgpack.packb(env)


def test_rejections_name_their_reason() -> None:
    registration = _registration()
    good = encode(registration)
    payload = registration.model_dump(by_alias=True)
    assert _reason(good, max_bytes=len(good) - 1) == "oversized"
    assert _reason(good[:-5]) == "truncated"
    assert _reason(good + b"\x00") == "malformed"
    assert _reason(b"\xc1") == "malformed"
    assert _reason(msgpack.packb([1, 2])) == "bad_envelope"
    assert _reason(encode(_hint())) == "wrong_topic"
    assert _reason(_with_payload(dict(payload, schema="semblend.donor/v2"))) == "wrong_version"
    assert _reason(_with_payload(dict(payload, schema="other/v1"))) == "unknown_schema"
    assert _reason(_with_payload(dict(payload, block_hashes=[-1]))) == "invalid_fields"
    assert _reason(_with_payload(dict(payload, extra=1))) == "invalid_fields"
    assert _reason(_with_payload(dict(payload, embedding_dim=3))) == "invalid_fields"
    assert _reason(_with_payload(dict(payload, schema="semblend.lifecycle/v1"))) == "unexpected_schema"
    other = deployment_digest(KEY.model_copy(update={"model_id": "other"}))
    assert _reason(good, deployment=other) == "wrong_namespace"
    assert decode(good, DonorRegistration, max_bytes=MAX, deployment=DEPLOY) == registration


def test_tenant_salt_does_not_change_the_deployment_digest() -> None:
    assert deployment_digest(KEY) == deployment_digest(KEY.with_salt("tenantB"))
    assert KEY.digest() != KEY.with_salt("tenantB").digest()


def _kv_message(events: list[dict], topic: str = "kv-events") -> bytes:
    env = {
        "publisher_id": 7604982147631473,
        "sequence": 0,
        "published_at": 1795282782115,
        "topic": topic,
        "payload": msgpack.packb(events, use_bin_type=True),
    }
    return msgpack.packb(env, use_bin_type=True)


WID = 8348771209726923741


def _router_event(event_id: int, data: object, dp_rank: int = 0) -> dict:
    return {
        "worker_id": WID,
        "storage_tier": "device",
        "residency_domain": "worker",
        "event": {"event_id": event_id, "data": data, "dp_rank": dp_rank},
    }


def test_dynamo_kv_events_decode_to_typed_events() -> None:
    """The three shapes of Dynamo 1.6's KV events (stored, removed, cleared), in one message."""
    stored = {
        "stored": {
            "parent_hash": None,
            "start_position": None,
            "blocks": [
                {"block_hash": 15310707395900538725, "tokens_hash": 15310707395893867146, "mm_extra_info": None},
                {"block_hash": 2, "tokens_hash": 15292316782987903195, "mm_extra_info": None},
            ],
        }
    }
    data = _kv_message(
        [
            _router_event(1, stored),
            _router_event(2, {"removed": {"block_hashes": [14928757266175748973]}}, dp_rank=1),
            _router_event(3, "cleared"),
        ]
    )
    batch = decode_kv_events(data, max_bytes=MAX)
    assert batch.publisher_id == 7604982147631473
    first, second, third = batch.events
    assert isinstance(first.data, KvStored)
    assert first.data.block_hashes == [15310707395900538725, 2]
    assert first.data.tokens_hashes == [15310707395893867146, 15292316782987903195]
    assert (first.worker_id, first.event_id, first.num_blocks) == (WID, 1, 2)
    assert isinstance(second.data, KvRemoved) and second.dp_rank == 1
    assert second.data.block_hashes == [14928757266175748973]
    assert isinstance(third.data, KvCleared) and third.num_blocks == 0


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([_router_event(1, {"stored": {"blocks": []}})], "invalid_fields"),
        ([_router_event(1, {"stored": {"blocks": [{"block_hash": -4, "tokens_hash": 1}]}})], "invalid_fields"),
        ([_router_event(1, {"flushed": {}})], "invalid_fields"),
        ([_router_event(1, "cleared", dp_rank=-1)], "invalid_fields"),
        ([{"worker_id": 1}], "invalid_fields"),
    ],
)
def test_bad_kv_events_are_rejected(events: list[dict], reason: str) -> None:
    with pytest.raises(RejectedMessage) as info:
        decode_kv_events(_kv_message(events), max_bytes=MAX)
    assert info.value.reason == reason


def test_kv_events_on_wrong_topic_rejected() -> None:
    with pytest.raises(RejectedMessage) as info:
        decode_kv_events(_kv_message([], topic="kv_metrics"), max_bytes=MAX)
    assert info.value.reason == "wrong_topic"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_decoders_reject_arbitrary_bytes_without_other_exceptions(data: bytes) -> None:
    for call in (
        lambda: decode(data, (DonorRegistration, DonorLifecycle), max_bytes=MAX),
        lambda: decode_kv_events(data, max_bytes=MAX),
    ):
        try:
            call()
        except RejectedMessage as exc:
            assert exc.reason in REJECT_REASONS


def test_subjects_sit_beside_dynamo_kv_events() -> None:
    cfg = SemblendConfig(dynamo_namespace="demo", worker_component="worker", worker_endpoint="generate")
    s = Subjects.for_config(cfg)
    assert s.kv_events == "namespace.demo.component.worker.endpoint.generate.kv-events"
    assert s.evidence == "namespace.demo.component.worker.endpoint.generate.semblend.evidence"
    assert s.donors.endswith(".semblend.donors") and s.outcomes.endswith(".semblend.outcomes")
    assert s.hints(255) == "namespace.demo.component.worker.endpoint.generate.semblend.hints.00000000000000ff"
    with pytest.raises(ValueError):
        Subjects.for_endpoint("a.b", "c", "d")
    with pytest.raises(ValueError):
        Subjects.for_endpoint("a", "*", "d")


def test_envelope_requires_only_the_keys_used_and_ignores_extras() -> None:
    """Upstream Dynamo adds ``published_at_ns``; extra keys are ignored, the used ones still required."""
    registration = _registration()
    env = msgpack.unpackb(encode(registration), raw=False)
    extended = msgpack.packb(dict(env, published_at_ns=1795282782115000000, future={"x": 1}), use_bin_type=True)
    assert decode(extended, DonorRegistration, max_bytes=MAX) == registration
    minimal = msgpack.packb({"topic": env["topic"], "payload": env["payload"]}, use_bin_type=True)
    assert decode(minimal, DonorRegistration, max_bytes=MAX) == registration
    for missing in ("topic", "payload"):
        assert _reason(msgpack.packb({k: v for k, v in env.items() if k != missing})) == "bad_envelope"
    assert _reason(msgpack.packb(dict(env, sequence=-1))) == "bad_envelope"

    kv = msgpack.unpackb(_kv_message([_router_event(1, "cleared")]), raw=False)
    batch = decode_kv_events(msgpack.packb(dict(kv, published_at_ns=1, sequence=9), use_bin_type=True), max_bytes=MAX)
    assert (batch.sequence, len(batch.events)) == (9, 1)
    bare = decode_kv_events(msgpack.packb({"topic": "kv-events", "payload": kv["payload"]}), max_bytes=MAX)
    assert (bare.publisher_id, bare.sequence, len(bare.events)) == (0, 0, 1)


@pytest.mark.nats
async def test_an_urgent_hint_has_left_the_process_when_send_first_returns_and_is_queued_when_it_cannot(
    nats_server,
) -> None:
    import asyncio
    import threading
    import time

    import nats

    from semblend_dynamo.events.link import NatsLink
    from semblend_dynamo.events.publisher import EvidencePublisher

    cfg = SemblendConfig(nats_url=nats_server.url)
    subject = Subjects.for_config(cfg).hints(7)
    got: list[bytes] = []
    listening, received = threading.Event(), threading.Event()

    def reader() -> None:  # on its own loop: it reads while this test's loop is blocked
        async def run() -> None:
            nc = await nats.connect(nats_server.url)

            async def on_hint(msg) -> None:
                got.append(msg.data)
                received.set()

            await nc.subscribe(subject, cb=on_hint)
            await nc.flush()
            listening.set()
            await asyncio.get_running_loop().run_in_executor(None, received.wait, 10)
            await nc.close()

        asyncio.run(run())

    thread = threading.Thread(target=reader)
    thread.start()
    assert listening.wait(10)
    link = NatsLink(cfg, name="urgent")
    link.start()
    await asyncio.wait_for(link.wait_connected(), 10)
    publisher = EvidencePublisher(link, queue_size=4)  # no drain task: only send_first can deliver
    assert await publisher.send_first(subject, _hint(), timeout=2.0)
    deadline = time.monotonic() + 5  # this loop runs nothing more: the hint must already be on its way
    while not received.is_set() and time.monotonic() < deadline:
        time.sleep(0.005)
    thread.join(10)
    assert len(got) == 1 and isinstance(decode(got[0], DonorHint, max_bytes=MAX), DonorHint) and publisher.backlog == 0
    await link.close()
    assert not await publisher.send_first(subject, _hint(), timeout=2.0)  # no connection: queued, not lost
    assert publisher.backlog == 1


@contextlib.asynccontextmanager
async def _urgent_link(nats_server):  # type: ignore[no-untyped-def]
    """A connected hint link, a hint subject, a subscription to it and a publisher on the link (closed after)."""
    import nats

    from semblend_dynamo.events.link import NatsLink
    from semblend_dynamo.events.publisher import EvidencePublisher

    cfg = SemblendConfig(nats_url=nats_server.url)
    subject = Subjects.for_config(cfg).hints(7)
    listener = await nats.connect(nats_server.url)
    sub = await listener.subscribe(subject)
    await listener.flush()
    link = NatsLink(cfg, name="urgent")
    link.start()
    await asyncio.wait_for(link.wait_connected(), 10)
    try:
        yield link, subject, sub, EvidencePublisher(link, queue_size=4)
    finally:
        await link.close()
        await listener.close()


@pytest.mark.nats
async def test_an_urgent_hint_is_written_out_without_giving_the_event_loop_a_turn(nats_server) -> None:
    """The hint reaches the socket inside ``send_first``: no loop iteration (each costs the request time)."""
    async with _urgent_link(nats_server) as (_link, subject, sub, publisher):
        loop_turns: list[int] = []
        asyncio.get_running_loop().call_soon(loop_turns.append, 1)
        assert await publisher.send_first(subject, _hint(), timeout=2.0)
        assert loop_turns == []
        msg = await sub.next_msg(timeout=5)
        assert isinstance(decode(msg.data, DonorHint, max_bytes=MAX), DonorHint) and publisher.backlog == 0


@pytest.mark.nats
async def test_an_urgent_hint_on_an_idle_connection_is_written_without_waking_the_clients_flusher(nats_server) -> None:
    """With nothing queued ahead of it, ``send_first`` writes the hint's PUB itself: nats-py's flusher task is not
    kicked (no later loop turn spent finding nothing to write), and the client's counters still count it."""
    async with _urgent_link(nats_server) as (link, subject, sub, publisher):
        nc = link._nc
        assert nc is not None
        await asyncio.sleep(0.05)  # the connect's own commands written
        out_msgs = nc.stats["out_msgs"]
        assert await publisher.send_first(subject, _hint(), timeout=2.0)
        assert nc._flush_queue is not None and nc._flush_queue.empty() and not nc._pending
        assert nc.stats["out_msgs"] == out_msgs + 1
        msg = await sub.next_msg(timeout=5)
        assert isinstance(decode(msg.data, DonorHint, max_bytes=MAX), DonorHint) and publisher.backlog == 0


@pytest.mark.nats
async def test_an_urgent_hint_stays_behind_what_the_client_has_buffered_already(nats_server) -> None:
    """A publish still in nats-py's buffer goes out first: the hint never overtakes it (nor the next one it)."""
    async with _urgent_link(nats_server) as (link, subject, sub, publisher):
        await link.publish(subject, b"before")  # buffered: the flusher task writes it on a later loop turn
        assert link._nc is not None and link._nc._pending
        assert await publisher.send_first(subject, _hint(), timeout=2.0)
        await link.publish(subject, b"after")
        got = [(await sub.next_msg(timeout=5)).data for _ in range(3)]
        assert got[0] == b"before" and got[2] == b"after"
        assert isinstance(decode(got[1], DonorHint, max_bytes=MAX), DonorHint)


@pytest.mark.nats
async def test_an_urgent_publish_on_a_subject_nats_py_would_refuse_is_never_written(nats_server) -> None:
    """The subject check is made once a subject (remembered): a refused subject stays refused on every call, a plain one
    is written every time."""
    async with _urgent_link(nats_server) as (link, subject, sub, _publisher):
        for _ in range(2):
            for bad in ("semblend.hints.*", "semblend..hints", "semblend.hints.>", "a b"):
                assert not await link.publish_written(bad, b"x", 2.0)
            assert await link.publish_written(subject, b"plain", 2.0)
        assert [(await sub.next_msg(timeout=5)).data for _ in range(2)] == [b"plain", b"plain"]
        assert link._nc is not None and not link._nc._pending
