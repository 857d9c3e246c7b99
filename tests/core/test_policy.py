"""The donor policy: one table of who may get and give semantic KV."""

from __future__ import annotations

import pytest

from semblend_dynamo.config import SemblendConfig, isolation_rule_error
from semblend_dynamo.outcomes import DeclineReason as R
from semblend_dynamo.policy import DonorPolicy, Lineage, Tenancy, isolation_in_force_error

EXACT = SemblendConfig()
SHIFTED_SALT = SemblendConfig(exact_materialization_only=False, isolation="cache_salt")
SHIFTED_NO_REUSE = SemblendConfig(exact_materialization_only=False, isolation="no_block_reuse")
ISOLATED = Tenancy.from_salt("acme|n1")
TENANT_ONLY = Tenancy.from_salt("acme")
BY_ID = Tenancy.from_salt_id(42)


def test_tenants_from_each_shape() -> None:
    assert (ISOLATED.tenant, TENANT_ONLY.tenant, BY_ID.tenant) == ("acme", "acme", "salt-id:42")
    assert Tenancy.from_salt(None).tenant == "" and Tenancy.from_salt_id(None).tenant == ""
    assert Tenancy.unknown().tenant is None
    assert (ISOLATED.isolating, TENANT_ONLY.isolating, BY_ID.isolating) == (True, False, False)


@pytest.mark.parametrize(
    ("cfg", "tenancy", "lineage", "load", "give"),
    [
        (EXACT, TENANT_ONLY, Lineage.EXACT, None, None),
        (EXACT, TENANT_ONLY, Lineage.APPROXIMATE, R.EXACT_ONLY_MODE, R.APPROXIMATE_LINEAGE),
        (EXACT, Tenancy.unknown(), Lineage.EXACT, R.TENANT_UNKNOWN, R.TENANT_UNKNOWN),
        (SHIFTED_SALT, ISOLATED, Lineage.APPROXIMATE, None, None),
        (SHIFTED_SALT, TENANT_ONLY, Lineage.APPROXIMATE, R.ISOLATION_REQUIRED, R.ISOLATION_REQUIRED),
        (SHIFTED_SALT, BY_ID, Lineage.APPROXIMATE, R.ISOLATION_REQUIRED, R.ISOLATION_REQUIRED),
        (SHIFTED_SALT, BY_ID, Lineage.EXACT, None, None),
        (SHIFTED_NO_REUSE, TENANT_ONLY, Lineage.APPROXIMATE, None, None),
        (SemblendConfig(enabled=False), TENANT_ONLY, Lineage.EXACT, R.SEMANTIC_DISABLED, R.SEMANTIC_DISABLED),
        (SemblendConfig(discovery_only=True), TENANT_ONLY, Lineage.EXACT, R.DISCOVERY_ONLY, None),
    ],
)
def test_load_and_give_rules(cfg, tenancy, lineage, load, give) -> None:
    policy = DonorPolicy(cfg)
    assert policy.may_load(tenancy, lineage) == load
    assert policy.may_give(tenancy, lineage) == give


def test_device_hits_under_a_per_request_salt_are_approximate_only_in_shifted_mode() -> None:
    assert DonorPolicy(SHIFTED_SALT).device_prefix_lineage(ISOLATED, 64) is Lineage.APPROXIMATE
    assert DonorPolicy(SHIFTED_SALT).device_prefix_lineage(ISOLATED, 0) is Lineage.EXACT
    assert DonorPolicy(SHIFTED_SALT).device_prefix_lineage(TENANT_ONLY, 64) is Lineage.EXACT
    assert DonorPolicy(EXACT).device_prefix_lineage(ISOLATED, 64) is Lineage.EXACT


def test_start_up_rules() -> None:
    assert "SEMBLEND_ISOLATION" in (isolation_rule_error("shifted", "none") or "")
    assert isolation_rule_error(SHIFTED_SALT.mode, SHIFTED_SALT.isolation) is None
    assert "enable_block_reuse" in (isolation_in_force_error(SHIFTED_NO_REUSE, engine_block_reuse=True) or "")
    assert isolation_in_force_error(SHIFTED_NO_REUSE, engine_block_reuse=False) is None
    assert isolation_in_force_error(SHIFTED_SALT, engine_block_reuse=True) is None
    assert isolation_in_force_error(SemblendConfig(isolation="no_block_reuse"), engine_block_reuse=True) is None
