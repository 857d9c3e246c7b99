"""Tenant identity in the router: a request whose tenant cannot be established neither gets nor gives semantic KV."""

from __future__ import annotations

from typing import Any

import pytest

from semblend_dynamo.outcomes import DeclineReason, Outcome
from tests.router.test_handler import W1, _make_resident_donor, _prompt, _router

UNREADABLE = [
    {"routing": {"cache_namespace": 7}},  # an integer salt id
    {"extra_args": {"nvext": {"cache_salt": 7}}},
    {"extra_args": {"nvext": {"cache_salt": ["acme"]}}},
    {"extra_args": {"nvext": {"cache_salt": "|nonce-only"}}},  # a nonce without a tenant
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
    a = router.parse({"token_ids": [1, 2, 3], "routing": {"cache_namespace": 7}})
    b = router.parse({"token_ids": [1, 2, 3], "routing": {"cache_namespace": 7}})
    assert not a.tenant_known and not b.tenant_known and a.namespace != b.namespace
    assert router.parse({"token_ids": [1, 2, 3]}).tenant_known


def test_an_empty_cache_namespace_falls_back_to_the_frontend_salt() -> None:
    router, _ = _router()
    routed = router.parse(
        {"token_ids": [1], "routing": {"cache_namespace": ""}, "extra_args": {"nvext": {"cache_salt": "acme|n1"}}}
    )
    assert routed.tenant_known and routed.cache_salt == "acme|n1"
    assert routed.namespace == router.parse({"token_ids": [1], "routing": {"cache_namespace": "acme|n1"}}).namespace
