"""Reading the tenant from every request shape TensorRT-LLM passes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from semblend_dynamo.policy import Tenancy
from trtllm_connector.tenancy import read_tenancy, refine


@pytest.mark.parametrize(
    ("fields", "tenant"),
    [
        ({"cache_salt": "acme|n"}, "acme"),
        ({"py_cache_salt": "acme|n"}, "acme"),
        ({"cache_salt": None}, ""),
        ({"cache_salt_id": 7}, "salt-id:7"),
        ({"py_cache_salt_id": 7}, "salt-id:7"),
        ({"cache_salt_id": None}, ""),
        ({"cache_salt": None, "cache_salt_id": 7}, "salt-id:7"),
        ({"cache_salt": "acme", "cache_salt_id": 7}, "acme"),
        ({}, None),
        ({"cache_salt": b"acme"}, None),
        ({"cache_salt_id": "7"}, None),
    ],
)
def test_read_tenancy(fields: dict, tenant: str | None) -> None:
    assert read_tenancy(SimpleNamespace(**fields)).tenant == tenant


def test_request_data_salt_fills_only_an_unknown_or_unsalted_tenancy() -> None:
    rd = SimpleNamespace(cache_salt="acme|n")
    assert refine(Tenancy.unknown(), rd).tenant == "acme"
    assert refine(Tenancy.from_salt(None), rd).tenant == "acme"
    assert refine(Tenancy.from_salt_id(7), rd).tenant == "salt-id:7"
    assert refine(Tenancy.from_salt("other"), rd).tenant == "other"
    assert refine(Tenancy.unknown(), SimpleNamespace()).tenant is None
