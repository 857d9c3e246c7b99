"""No KV crosses a tenant, salt, LoRA or model, whatever request shape the engine passes (0 crossings).

Each case runs a donor and a recipient that shares its first 64 tokens (exact mode: the recipient would get all 64),
then counts the tokens that crossed from one isolation domain into another.
"""

from __future__ import annotations

import pytest
import torch

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.schemas import DonorHint, request_key
from tests.connector.conftest import BASE_SETTINGS, decline_reason, prompt, records
from trtllm_connector import metrics
from trtllm_connector.harness import PyExecutorHarness, salt_id

SHAPES = ["cache_salt", "py_cache_salt", "cache_salt_id", "request_data"]
DONOR = prompt(41, 100)
TARGET = DONOR[:64] + prompt(42, 20)


def _pair(h: PyExecutorHarness, donor: dict, target: dict) -> tuple[int, int]:
    """(whether the donor was pinned, tokens the target received)."""
    d = h.run_request(DONOR, **donor)
    t = h.run_request(TARGET, **target)
    assert torch.equal(t.kv, h.fresh_kv(TARGET))  # exact mode: whatever happened, the target's KV is right
    return int(d.pinned), t.promised


@pytest.mark.parametrize("shape", SHAPES)
def test_other_tenant_gets_nothing_in_any_request_shape(make_harness, shape: str) -> None:
    h = make_harness()
    pinned, crossed = _pair(
        h, {"cache_salt": "acme|d", "salt_shape": shape}, {"cache_salt": "rival|r", "salt_shape": shape}
    )
    assert pinned == 1 and crossed == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_same_salt_shares_exact_kv_in_every_request_shape(make_harness, shape: str) -> None:
    h = make_harness()
    pinned, received = _pair(
        h, {"cache_salt": "acme", "salt_shape": shape}, {"cache_salt": "acme", "salt_shape": shape}
    )
    assert pinned == 1 and received == 64


def test_an_integer_salt_id_is_not_read_as_the_empty_tenant(make_harness) -> None:
    h = make_harness()  # the case: a salt-less donor, a recipient carrying only cache_salt_id
    pinned, crossed = _pair(h, {"cache_salt": None}, {"cache_salt": "rival", "salt_shape": "cache_salt_id"})
    assert pinned == 1 and crossed == 0


def test_a_request_without_any_salt_field_neither_gets_nor_gives(make_harness) -> None:
    h = make_harness()
    refused_before = metrics.DONORS.labels("tenant_unknown")._value.get()
    pinned, crossed = _pair(h, {"cache_salt": None}, {"salt_shape": "none"})
    assert pinned == 1 and crossed == 0
    assert decline_reason(h, 2) == "tenant_unknown"
    unknown_donor = h.run_request(prompt(43, 100), salt_shape="none")
    assert not unknown_donor.pinned
    assert metrics.DONORS.labels("tenant_unknown")._value.get() - refused_before == 2  # both unknown requests
    later = h.run_request(prompt(43, 100)[:64] + prompt(44, 20), cache_salt=None)
    assert later.promised == 0


def test_a_13_request_decided_by_its_salt_id_gives_under_that_id(make_harness) -> None:
    h = make_harness()  # RequestData.cache_salt arrives after the decision; the donor keeps the tenant it got under
    d = h.run_request(DONOR, cache_salt="acme", salt_shape="request_data")
    [reg] = records(h, "donor_registered", d.request_id)
    assert reg.namespace == h.scheduler.model.namespace(tenant=f"salt-id:{salt_id('acme')}").digest()


def test_lora_twins_share_nothing(make_harness) -> None:
    h = make_harness()
    pinned, crossed = _pair(h, {"cache_salt": "acme", "lora_task_id": 1}, {"cache_salt": "acme", "lora_task_id": 2})
    assert pinned == 1 and crossed == 0
    assert decline_reason(h, 2) == "no_candidate"


def test_model_twins_in_one_process_share_nothing(clock) -> None:
    a = PyExecutorHarness.with_stand_in(SemblendConfig(**BASE_SETTINGS, model_id="model-a"), clock=clock)
    b = PyExecutorHarness.with_stand_in(SemblendConfig(**BASE_SETTINGS, model_id="model-b"), clock=clock)
    donor = a.run_request(DONOR, cache_salt="acme")
    assert donor.pinned and len(a.scheduler.registry) == 1 and len(b.scheduler.registry) == 0
    # A router mistake: model A's hint delivered to model B's engine.
    b.scheduler.hints.submit(
        DonorHint(
            request_key=request_key(TARGET),
            donor_id=a.scheduler.registry.donor_id_for(donor.request_id),
            worker_id=0,
            namespace=a.scheduler.model.namespace(tenant="acme").digest(),
            spans=[(0, 0, 64)],
            decision="semantic_placement",
        )
    )
    t = b.run_request(TARGET, cache_salt="acme")
    assert t.promised == 0 and t.connector_written_blocks == []
    assert decline_reason(b, t.request_id) == "namespace_mismatch"
