"""Malformed, truncated, oversized, wrong-version and deeply nested messages on every subject, on a real nats-server.

10,000 seeded messages per subject: the five the router consumes (kv-events, donors, outcomes, donors.sync and its
own sync inbox) and the two other consumers decode with the same library (evidence, hints). Every message is
counted as accepted or rejected, nothing raises out of a handler, and donors.sync replies never outnumber the valid
requests.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import nats
import pytest

from semblend_dynamo.events.codec import encode
from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.schemas import (
    DonorHint,
    DonorRegistration,
    DonorSyncPage,
    DonorSyncRequest,
    OutcomeReport,
    RouteEvidence,
)
from semblend_dynamo.events.subscriber import EventSubscriber
from semblend_dynamo.outcomes import Outcome
from semblend_dynamo.router.sync import sync_inbox
from tests.adversarial.router_harness import MAX_BYTES, InProcessRouter, router_config
from tests.support.nats import NatsServer

pytestmark = pytest.mark.nats

PER_SUBJECT = 10_000
FUZZER = "fuzzer"
WORKER = 0x5EED


def _envelope(topic: str, payload: bytes, **extra: Any) -> bytes:
    return msgpack.packb(
        {"publisher_id": 1, "sequence": 2, "published_at": 3, "topic": topic, "payload": payload, **extra},
        use_bin_type=True,
    )


def _nested(depth: int) -> bytes:
    """A msgpack array nested ``depth`` deep (built as bytes: no recursion needed to make it)."""
    return b"\x91" * depth + b"\x00"


class Seeds:
    """One valid message per subject, plus its envelope topic and payload map, for deployment ``deployment``."""

    def __init__(self, deployment: str) -> None:
        registration = DonorRegistration(
            donor_id="peer-donor",
            router_id="peer",
            worker_id=WORKER,
            deployment=deployment,
            namespace="0" * 16,
            num_tokens=32,
            block_size=16,
            block_hashes=[1, 2],
            embedding=b"",
            embedding_dim=0,
        )
        outcome = OutcomeReport(
            request_id="r",
            request_key="k",
            worker_id=WORKER,
            deployment=deployment,
            namespace="n",
            outcome=Outcome.COLD_FALLBACK,
        )
        evidence = RouteEvidence(
            request_id="r",
            request_key="k",
            deployment=deployment,
            namespace="n",
            outcome=Outcome.COLD_FALLBACK,
            prompt_tokens=3,
        )
        hint = DonorHint(
            request_key="k", donor_id="d", worker_id=WORKER, namespace="n", decision=Outcome.SEMANTIC_PLACEMENT
        )
        self.models: dict[str, Any] = {
            "donors": registration,
            "outcomes": outcome,
            "donors_sync": DonorSyncRequest(router_id=FUZZER, deployment=deployment),
            "sync_pages": DonorSyncPage.of(
                [registration],
                router_id="peer",
                deployment=deployment,
                after=0,
                upto=None,
                next_cursor=None,
                last_cursor=1,
            ),
            "evidence": evidence,
            "hints": hint,
        }
        kv_events = [
            {
                "worker_id": WORKER,
                "storage_tier": "device",
                "event": {
                    "event_id": 1,
                    "dp_rank": 0,
                    "data": {"stored": {"parent_hash": None, "blocks": [{"block_hash": 5, "tokens_hash": 6}]}},
                },
            }
        ]
        self.payloads: dict[str, Any] = {"kv_events": kv_events} | {
            k: m.model_dump(mode="python", by_alias=True) for k, m in self.models.items()
        }
        self.topics = {"kv_events": "kv-events"} | {
            k: msgpack.unpackb(encode(m), raw=False)["topic"] for k, m in self.models.items()
        }

    def valid(self, stream: str, **extra: Any) -> bytes:
        return _envelope(self.topics[stream], msgpack.packb(self.payloads[stream], use_bin_type=True), **extra)

    def with_payload(self, stream: str, payload: Any) -> bytes:
        return _envelope(self.topics[stream], msgpack.packb(payload, use_bin_type=True))


def fuzz(stream: str, seeds: Seeds, foreign: Seeds, rng: random.Random, n: int) -> list[tuple[bytes, str]]:
    """``n`` messages for one stream, each with the reply subject it is sent with."""
    seed = seeds.valid(stream)
    others = [s for s in seeds.topics if s != stream]
    payload = seeds.payloads[stream]
    out: list[tuple[bytes, str]] = []
    for i in range(n):
        kind = i % 10
        reply = sync_inbox(FUZZER) if i % 3 else ""
        if kind == 0:
            data = rng.randbytes(rng.randrange(0, 400))
        elif kind == 1:
            data = seed[: rng.randrange(0, len(seed))]
        elif kind == 2:
            flipped = bytearray(seed)
            for _ in range(rng.randrange(1, 4)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            data = bytes(flipped)
        elif kind == 3:
            data = seeds.valid(stream, padding=rng.randbytes(MAX_BYTES)) if i % 50 == 3 else seed[::-1]
        elif kind == 4:  # wrong version (kv-events: an event kind this decoder does not know)
            if isinstance(payload, dict):
                kind_name, version = payload["schema"].rsplit("/v", 1)
                data = seeds.with_payload(stream, dict(payload, schema=f"{kind_name}/v{int(version) + 1}"))
            else:
                data = seeds.with_payload(stream, [dict(payload[0], event={"event_id": 1, "data": {"flushed": {}}})])
        elif kind == 5:
            data = _envelope(seeds.topics[stream], _nested(rng.choice([100, 1_000, 20_000])))
        elif kind == 6 and i % 20 == 6 and isinstance(payload, dict):  # a bytes field (column, embedding) cut short
            cut = {k: v[: rng.randrange(len(v))] for k, v in payload.items() if isinstance(v, bytes) and v}
            data = seeds.with_payload(stream, payload | dict([rng.choice(sorted(cut.items()))]) if cut else payload)
        elif kind == 6:  # deep nesting inside a field the decoder must validate
            nested: Any = 1
            for _ in range(rng.randrange(50, 400)):
                nested = [nested]
            field = "block_hashes" if stream != "kv_events" else "event"
            mutated = dict(payload, **{field: nested}) if isinstance(payload, dict) else [{"event": nested}]
            data = seeds.with_payload(stream, mutated)
        elif kind == 7:  # valid elsewhere: another subject's message or another deployment's
            data = foreign.valid(stream) if i % 2 else seeds.valid(rng.choice(others))
        elif kind == 8:  # valid, with envelope keys this decoder does not know
            data = seeds.valid(stream, published_at_ns=rng.getrandbits(63), future={"x": [1, 2]})
            reply = rng.choice([sync_inbox(FUZZER), "", "namespace.adv.component.backend.endpoint.generate.kv-events"])
        else:
            data = msgpack.packb(
                rng.choice(
                    [
                        {"topic": 5, "payload": "x"},
                        {"payload": seed},
                        [seed],
                        dict(publisher_id=-1, topic=seeds.topics[stream], payload=b""),
                    ]
                ),
                use_bin_type=True,
            )
        out.append((data, reply))
    return out


class LibraryConsumer:
    """Evidence and hint consumers as any component builds them from the library's subscriber."""

    def __init__(self, cfg: Any, deployment: str, evidence: str, hints: str) -> None:
        self.link = NatsLink(cfg, name="adversarial-consumer", retry_s=0.2)
        self.subscriber = EventSubscriber(self.link, max_bytes=MAX_BYTES, deployment=deployment)
        self.handled: Counter[str] = Counter()
        self.subscriber.semblend(evidence, (RouteEvidence,), self._count("evidence"), stream="evidence")
        self.subscriber.semblend(hints, (DonorHint,), self._count("hints"), stream="hints")

    def _count(self, stream: str) -> Callable[..., None]:
        def handler(event: Any, msg: Any) -> None:
            self.handled[stream] += 1

        return handler

    def counted(self, stream: str) -> int:
        return self.subscriber.received[stream] + sum(
            n for (s, _), n in self.subscriber.rejected.items() if s == stream
        )


async def test_ten_thousand_bad_messages_per_subject_all_counted_none_crash(nats_server: NatsServer) -> None:
    cfg = router_config(nats_server.url, sync_rate_per_s=50)
    replica = await InProcessRouter(cfg).start()
    router = replica.router
    consumer = LibraryConsumer(cfg, replica.deployment, router.subjects.evidence, router.subjects.hints(WORKER))
    consumer.link.start()
    await asyncio.wait_for(consumer.link.wait_connected(), 10)
    assert consumer.link._nc is not None
    await consumer.link._nc.flush()
    fuzzer = await nats.connect(nats_server.url, name="fuzzer")
    replies: list[bytes] = []

    async def on_reply(msg: Any) -> None:
        replies.append(msg.data)

    await fuzzer.subscribe(sync_inbox(FUZZER), cb=on_reply)
    await fuzzer.subscribe("namespace.adv.component.backend.endpoint.generate.kv-events.>", cb=on_reply)
    await fuzzer.flush()

    seeds, foreign = Seeds(replica.deployment), Seeds("f" * 16)
    subjects = {
        "kv_events": router.subjects.kv_events,
        "donors": router.subjects.donors,
        "outcomes": router.subjects.outcomes,
        "donors_sync": router.subjects.donors_sync,
        "sync_pages": router.sync_inbox,
        "evidence": router.subjects.evidence,
        "hints": router.subjects.hints(WORKER),
    }

    def own_requests() -> float:  # the replica's own sync and search index requests come back on donors.sync
        return sum(replica.metrics.events_out.labels(kind)._value.get() for kind in ("sync", "indexsnap"))

    own_sync_before = own_requests()
    baseline = {stream: replica.counted(stream) for stream in subjects}
    rng = random.Random(11)
    for stream, subject in subjects.items():
        for data, reply in fuzz(stream, seeds, foreign, rng, PER_SUBJECT):
            await fuzzer.publish(subject, data, reply=reply)
        await fuzzer.flush(timeout=30)

    def done() -> bool:
        own_sync = own_requests() - own_sync_before
        router_streams = all(
            replica.counted(s) - baseline[s] >= PER_SUBJECT + (own_sync if s == "donors_sync" else 0)
            for s in ("kv_events", "donors", "outcomes", "donors_sync", "sync_pages")
        )
        return router_streams and all(consumer.counted(s) >= PER_SUBJECT for s in ("evidence", "hints"))

    for _ in range(600):
        if done():
            break
        await asyncio.sleep(0.1)
    await replica.round_trip()
    await fuzzer.flush()
    own_sync = own_requests() - own_sync_before

    for stream in ("kv_events", "donors", "outcomes", "sync_pages"):
        assert replica.counted(stream) - baseline[stream] == PER_SUBJECT, stream
    assert replica.counted("donors_sync") - baseline["donors_sync"] == PER_SUBJECT + own_sync
    for stream in ("evidence", "hints"):
        assert consumer.counted(stream) == PER_SUBJECT, stream
    everything = Counter(replica.subscriber.rejected) + Counter(consumer.subscriber.rejected)
    assert not [key for key in everything if key[1] == "handler_error"]  # no handler raised on any message
    for stream in subjects:
        reasons = {reason for (s, reason) in everything if s == stream}
        assert {"malformed", "truncated", "oversized", "invalid_fields", "bad_envelope"} <= reasons, (stream, reasons)
        if stream != "kv_events":
            assert {"wrong_version", "wrong_topic"} <= reasons, (stream, reasons)
        if stream not in ("kv_events", "hints"):  # hints carry no deployment: their consumer checks the namespace
            assert "wrong_namespace" in reasons, (stream, reasons)
    # replies: at most one per valid request, only to the requester's inbox, none reflected elsewhere
    valid_requests = replica.subscriber.received["donors_sync"] - own_sync
    assert 0 < len(replies) == replica.metrics.sync_replies._value.get() <= valid_requests
    assert replica.rejected("donors_sync", "rate_limited") > 0
    assert replica.rejected("donors_sync", "bad_reply_subject") > 0 and replica.rejected("donors_sync", "no_reply") > 0
    # pages: one is used only as a peer's first answer to this replica's broadcast (the fuzzer answers no range)
    session = router._sync
    assert session is not None and replica.rejected("sync_pages", "unsolicited") > 0
    used = replica.subscriber.received["sync_pages"] - replica.rejected("sync_pages", "unsolicited")
    assert used == len(session.finished) + len(session._peers) and "peer" in session.finished
    # still routing: a fresh request is decided and forwarded
    outputs = [out async for out in router.generate({"token_ids": list(range(100, 180))})]
    assert outputs and replica.link.connected
    await fuzzer.close()
    await consumer.link.close()
    await replica.close()
