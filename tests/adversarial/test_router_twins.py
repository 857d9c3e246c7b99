"""Cross-tenant, salt, LoRA and model twins through the router and the pipeline: 0 crossings.

Every twin has the same prompt tokens; only its identity differs. Each request must find the donor of its own
identity (the positive control: the test would pass vacuously otherwise) and never another's.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgpack
import nats
import pytest
from dynamo.llm import compute_block_hash_for_seq

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.namespace import ModelIdentity
from semblend_dynamo.router.__main__ import build_discovery
from tests.adversarial.router_harness import BLOCK, InProcessRouter, router_config
from tests.router.test_handler import W2
from tests.support.nats import NatsServer

pytestmark = pytest.mark.nats

RNG = random.Random(2026)
SYSTEM = [RNG.randrange(100, 7000) for _ in range(32)]
DOCS = [[RNG.randrange(100, 7000) for _ in range(96)] for _ in range(3)]
# (donor salt, request salt, lora): the request's salt differs (a per-request nonce) but names the same tenant
TWINS = [
    ("", "", ""),
    ("acme|d1", "acme|r1", ""),
    ("globex|d1", "globex|r1", ""),
    ("acme|d2", "acme|r2", "lora-x"),
    ("", "", "lora-x"),
    ("initech", "initech", ""),
]


def _prompt(order: tuple[int, ...]) -> list[int]:
    return SYSTEM + [t for i in order for t in DOCS[i]]


def _request(tokens: list[int], salt: str, lora: str) -> dict[str, Any]:
    request: dict[str, Any] = {"token_ids": tokens}
    if salt:
        request["extra_args"] = {"nvext": {"cache_salt": salt}}
    if lora:
        request["routing"] = {"lora_name": lora}
    return request


def _kv_stored(event_id: int, hashes: list[int]) -> bytes:
    blocks = [{"block_hash": event_id * 1000 + i, "tokens_hash": h} for i, h in enumerate(hashes)]
    events = [{"worker_id": W2, "event": {"event_id": event_id, "dp_rank": 0, "data": {"stored": {"blocks": blocks}}}}]
    envelope = {"topic": "kv-events", "payload": msgpack.packb(events, use_bin_type=True)}
    return msgpack.packb(envelope, use_bin_type=True)


async def _wait(predicate: Any, what: str) -> None:
    for _ in range(300):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_twins_through_the_router_find_only_their_own_donor(nats_server: NatsServer) -> None:
    cfg = router_config(nats_server.url)
    a = await InProcessRouter(cfg).start()
    b = await InProcessRouter(cfg, model_id="twin-model").start()  # same subjects, another model
    workers = await nats.connect(nats_server.url, name="workers")
    donors = _prompt((0, 1, 2))
    for event_id, (salt, _, lora) in enumerate(TWINS, start=1):
        for replica in (a, b):
            assert [out async for out in replica.router.generate(_request(donors, salt, lora))]
        hashes = compute_block_hash_for_seq(donors, BLOCK, lora_name=lora or None, cache_namespace=salt or None)
        await workers.publish(a.router.subjects.kv_events, _kv_stored(event_id, hashes))
    await workers.flush()
    await a.router.drain_registrations()
    await b.router.drain_registrations()
    await _wait(lambda: len(a.router.catalog) == len(TWINS) == sum(map(a.router.catalog.is_resident, _ids(a))), "A")
    await _wait(lambda: a.rejected("donors", "wrong_namespace") >= len(TWINS), "B's registrations at A")
    assert len(a.router.catalog) == len(TWINS)  # B's donors were refused: another model's deployment

    crossings = own = 0
    target = _prompt((2, 0, 1))
    for _, request_salt, lora in TWINS:
        routed = a.router.parse(_request(target, request_salt, lora))
        decision = await a.router.decide(routed)
        assert decision.hint is not None, (request_salt, lora)
        donor_namespace = decision.hint.donor_id.split(":")[1]
        if donor_namespace == routed.namespace.digest():
            own += 1
        else:
            crossings += 1
    unreadable = dict(_request(target, "", ""), extra_args={"nvext": {"cache_salt": ["acme"]}})
    unknown = await a.router.decide(a.router.parse(unreadable))
    salt_id = await a.router.decide(a.router.parse(dict(_request(target, "", ""), routing={"cache_namespace": 7})))
    other_lora = await a.router.decide(a.router.parse(_request(target, "acme|r9", "lora-unseen")))
    other_tenant = await a.router.decide(a.router.parse(_request(target, "hooli|r1", "")))
    assert (own, crossings) == (len(TWINS), 0)
    assert unknown.hint is None and salt_id.hint is None and other_lora.hint is None and other_tenant.hint is None
    await workers.close()
    await a.close()
    await b.close()


def _ids(replica: InProcessRouter) -> list[str]:
    return [d["donor_id"] for d in replica.router.catalog.snapshot()]


def test_twins_through_the_pipeline_share_nothing_across_namespaces() -> None:
    cfg = SemblendConfig(block_size=BLOCK, embedder="hash", min_span_tokens=32)
    discovery = build_discovery(cfg)
    assert discovery is not None
    models = [ModelIdentity.from_config(cfg), ModelIdentity.from_config(cfg.model_copy(update={"model_id": "twin"}))]
    namespaces = [
        model.namespace(lora=lora, tenant=tenant)
        for model in models
        for tenant in ("", "acme", "globex")
        for lora in ("", "lora-x")
    ]
    assert len({ns.digest() for ns in namespaces}) == len(namespaces) == 12
    for i, ns in enumerate(namespaces):
        discovery.register_donor(f"donor-{i}", ns, _prompt((0, 1, 2)))
    discovery.drain(timeout=30)
    crossings = own = 0
    for i, ns in enumerate(namespaces):
        for tokens in (_prompt((2, 0, 1)), _prompt((0, 1, 2))[:200]):
            result = discovery.discover(f"r{i}", ns, tokens)
            found = {c.donor_id for c in result.candidates} | {s.donor_id for s in result.spans}
            own += f"donor-{i}" in found
            crossings += len(found - {f"donor-{i}"})
    discovery.close()
    assert (own, crossings) == (2 * len(namespaces), 0)
