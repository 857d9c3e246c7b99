"""Tenant identity in the router, read as the connector reads it (``policy.Tenancy``).

A request whose tenant cannot be established neither gets nor gives semantic KV (counted ``tenant_unknown``).
"""

from __future__ import annotations

from typing import Any

import pytest

from semblend_dynamo.outcomes import DeclineReason, Outcome
from tests.router.test_handler import W1, _make_resident_donor, _prompt, _router

UNREADABLE = [
    {"routing": {"cache_namespace": ["acme"]}},
    {"extra_args": {"nvext": {"cache_salt": {"tenant": "acme"}}}},
    {"extra_args": {"nvext": {"cache_salt": 7.5}}},
    {"extra_args": {"nvext": {"cache_salt": True}}},
    {"extra_args": {"nvext": {"cache_salt": -3}}},
    {"extra_args": {"nvext": 3}},
]


@pytest.mark.parametrize("shape", UNREADABLE)
async def test_an_unknown_tenant_gets_no_donor_and_is_counted(shape: dict[str, Any]) -> None:
    router, kv = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    request = {"token_ids": _prompt((2, 0, 1)), **shape}
    outputs = [out async for out in router.generate(request)]
    assert outputs  # the request still runs, unrestricted
    sent = kv.forwarded[-1]
    assert "semblend" not in (sent.get("extra_args") or {})
    assert "allowed_worker_ids" not in (sent.get("routing") or {})
    assert router.metrics.declines.labels(DeclineReason.TENANT_UNKNOWN.value)._value.get() == 1
    assert router.metrics.decisions.labels(Outcome.COLD_FALLBACK.value)._value.get() == 1


@pytest.mark.parametrize("shape", UNREADABLE)
async def test_an_unknown_tenant_gives_no_donor(shape: dict[str, Any]) -> None:
    router, _ = _router()
    outputs = [out async for out in router.generate({"token_ids": _prompt((0, 1, 2)), **shape})]
    await router.drain_registrations()
    assert outputs and len(router.catalog) == 0
    known = [out async for out in router.generate({"token_ids": _prompt((0, 1, 2))})]
    await router.drain_registrations()
    assert known and len(router.catalog) == 1  # the same prompt with a readable (default) tenant does give


async def test_unknown_tenants_do_not_share_with_each_other() -> None:
    router, _ = _router()
    a = router.parse({"token_ids": [1, 2, 3], "routing": {"cache_namespace": ["x"]}})
    b = router.parse({"token_ids": [1, 2, 3], "routing": {"cache_namespace": ["x"]}})
    assert not a.tenancy.known and not b.tenancy.known and a.namespace != b.namespace
    assert router.parse({"token_ids": [1, 2, 3]}).tenancy.tenant == ""


async def test_an_integer_salt_id_is_its_own_tenant_not_the_empty_one() -> None:
    """The connector's finding: a salt id read as tenant "" received another tenant's KV. Here it gets nothing."""
    router, _ = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)  # a donor of the default tenant ""
    routed = router.parse({"token_ids": _prompt((2, 0, 1)), "extra_args": {"nvext": {"cache_salt": 7}}})
    assert routed.tenancy.tenant == "salt-id:7" and routed.namespace != router.parse({"token_ids": [1]}).namespace
    decision = await router.decide(routed)
    assert decision.hint is None and decision.reason is not DeclineReason.TENANT_UNKNOWN
    outputs = [
        out async for out in router.generate({"token_ids": _prompt((1, 2, 0)), "routing": {"cache_namespace": 7}})
    ]
    await router.drain_registrations()
    assert outputs and len(router.catalog) == 1  # it gave nothing: its blocks cannot be hashed as the engine does


async def test_a_nonce_without_a_tenant_is_the_default_tenant() -> None:
    """``isolating_salt("", nonce)`` is ``"|nonce"``: the default tenant, isolated per request."""
    router, _ = _router()
    _make_resident_donor(router, _prompt((0, 1, 2)), W1)
    routed = router.parse({"token_ids": _prompt((2, 0, 1)), "extra_args": {"nvext": {"cache_salt": "|n1"}}})
    assert routed.tenancy.tenant == "" and routed.tenancy.isolating


def test_an_empty_cache_namespace_falls_back_to_the_frontend_salt() -> None:
    router, _ = _router()
    routed = router.parse(
        {"token_ids": [1], "routing": {"cache_namespace": ""}, "extra_args": {"nvext": {"cache_salt": "acme|n1"}}}
    )
    assert routed.tenancy.tenant == "acme" and routed.cache_salt == "acme|n1"
    assert routed.namespace == router.parse({"token_ids": [1], "routing": {"cache_namespace": "acme|n1"}}).namespace


def test_requests_of_one_namespace_share_its_key() -> None:
    """The key is made once per LoRA and tenant (its digest, asked on the span path, is then found by identity);
    an unknown tenant's key is made for its request alone."""
    router, _ = _router()
    a = router.parse({"token_ids": [1], "routing": {"cache_namespace": "acme|n1", "lora_name": "l"}})
    b = router.parse({"token_ids": [2], "routing": {"cache_namespace": "acme|n1", "lora_name": "l"}})
    assert a.namespace is b.namespace
    assert router.parse({"token_ids": [1]}).namespace is router.parse({"token_ids": [3]}).namespace
    assert a.namespace != router.parse({"token_ids": [1], "routing": {"cache_namespace": "acme|n1"}}).namespace
    unknown = {"token_ids": [1], "routing": {"cache_namespace": ["x"]}}
    assert router.parse(unknown).namespace != router.parse(unknown).namespace
