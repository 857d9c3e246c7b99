"""The connector under both TensorRT-LLM API generations, and the 1.3+ hooks: request_reset, cancel_load,
block_hashes, layer groups."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from semblend_dynamo.config import SemblendConfig
from trtllm_connector.harness import HarnessKvCacheConfig, HarnessLlmArgs, PyExecutorHarness

from .conftest import BASE_SETTINGS, BLOCK, decline_reason, prompt, records


@pytest.mark.parametrize("api", ["1.2", "1.3"])
def test_exact_reuse_is_bit_identical_under_both_generations(make_harness, api: str) -> None:
    h = make_harness(api=api)
    donor = prompt(1, 100)
    assert h.run_request(donor, cache_salt="acme|d", output_tokens=3).pinned
    target = donor[:72] + prompt(2, 30)
    r = h.run_request(target, cache_salt="acme|d")
    assert r.promised == 72
    assert torch.equal(r.kv, h.fresh_kv(target))
    donor_record = h.scheduler.registry.get(h.scheduler.registry.donor_id_for(1))
    assert bool(donor_record.block_hashes) == (api == "1.3")  # 1.2 gives no hashes: nothing to cross-check


def test_the_1_2_harness_refuses_1_3_only_hooks(make_harness) -> None:
    h = make_harness(api="1.2")
    with pytest.raises(ValueError, match=r"1\.3\+ only"):
        h.run_request(prompt(1, 40), cancel_tail=8)


def test_an_engine_hash_mismatch_drops_the_exact_load(make_harness) -> None:
    h = make_harness()
    donor = prompt(3, 100)
    h.run_request(donor, cache_salt="acme|d")
    # Same tokens, same salt, but the engine keys the blocks differently (e.g. multimodal content we cannot see).
    r = h.run_request(donor[:72] + prompt(4, 30), cache_salt="acme|d", engine_extra_key="image-2")
    assert decline_reason(h, r.request_id) == "block_hash_mismatch"
    assert r.connector_written_blocks == []
    assert not records(h, "materialized", r.request_id)
    assert not r.pinned  # promised tokens that were never loaded: the request never becomes a donor


def test_different_salts_are_not_compared(make_harness) -> None:
    h = make_harness()  # exact mode: the tenant (before "|") scopes donors, the nonce differs per request
    donor = prompt(5, 100)
    h.run_request(donor, cache_salt="acme|n1")
    target = donor[:72] + prompt(6, 30)
    r = h.run_request(target, cache_salt="acme|n2")  # the engine's chains differ by the salt: not a mismatch
    assert r.promised == 72 and torch.equal(r.kv, h.fresh_kv(target))


def test_cancel_load_trims_the_promise_to_what_the_runtime_consumes(make_harness) -> None:
    h = make_harness()
    donor = prompt(7, 100)
    h.run_request(donor)
    target = donor[:72] + prompt(8, 30)
    r = h.run_request(target, cancel_tail=2 * BLOCK)
    assert r.promised == 72 - 2 * BLOCK  # the runtime computes the cancelled tail itself
    assert len(r.connector_written_blocks) == (72 - 2 * BLOCK) // BLOCK
    assert torch.equal(r.kv, h.fresh_kv(target))
    [m] = records(h, "materialized", r.request_id)
    assert m.materialized == 72 - 2 * BLOCK
    assert all(d.leases == 0 for d in h.scheduler.registry.donors())


def test_cancelling_the_whole_offer_drops_it_and_returns_the_leases(make_harness) -> None:
    h = make_harness()
    donor = prompt(9, 100)
    h.run_request(donor)
    target = donor[:72] + prompt(10, 30)
    r = h.run_request(target, cancel_tail=72)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "load_cancelled"
    assert torch.equal(r.kv, h.fresh_kv(target))
    assert all(d.leases == 0 for d in h.scheduler.registry.donors())
    assert r.pinned  # the runtime computed everything: its KV is a fresh prefill's, a valid donor


def test_request_reset_drops_the_promise_and_the_replay_is_decided_afresh(make_harness) -> None:
    h = make_harness()
    donor = prompt(11, 100)
    h.run_request(donor)
    target = donor[:72] + prompt(12, 30)
    r = h.run_request(target, reset_once=True)
    reasons = [x.rejection_reason for x in records(h, "declined", r.request_id)]
    assert [str(x) for x in reasons] == ["load_cancelled"]
    assert r.promised == 72 and torch.equal(r.kv, h.fresh_kv(target))  # the replay's own promise, loaded
    assert all(d.leases == 0 for d in h.scheduler.registry.donors())
    assert r.pinned  # not tainted by the reset


def test_more_than_one_layer_group_is_declined_with_a_reason(clock) -> None:
    cfg = SemblendConfig(**BASE_SETTINGS)
    kv_cfg = HarnessKvCacheConfig(BLOCK, max_attention_window=[4096, 512])  # variable sliding-window attention
    args = HarnessLlmArgs(BLOCK, kv_cache_config=kv_cfg)
    h = PyExecutorHarness.with_stand_in(cfg, llm_args=args, clock=clock)
    donor = prompt(13, 100)
    h.run_request(donor)
    r = h.run_request(donor[:72] + prompt(14, 30))
    assert r.promised == 0
    assert decline_reason(h, r.request_id) == "layer_groups_unsupported"


def test_per_layer_group_hooks(make_harness) -> None:
    h = make_harness()
    request = SimpleNamespace(request_id=99, prompt_len=40, get_tokens=lambda beam: prompt(15, 40), cache_salt=None)
    h.scheduler.update_state_after_alloc_by_layer_group(request, [[1, 2, 3, 4, 5], [6, 7]])
    assert h.scheduler.request_finished_by_layer_group(request, [[1, 2, 3, 4, 5], [6, 7]]) is False
    assert h.scheduler.request_finished_by_layer_group(request, [[1, 2, 3, -1, 5]]) is False  # no page: not a donor


def test_a_multi_group_cache_layout_registers_no_pool(make_harness) -> None:
    h = make_harness()
    layout = SimpleNamespace(groups=(object(), object()), as_single_pool_tensor=lambda: None)
    h.worker.register_kv_cache_layout(layout)
    assert h.worker.state.pool_state().layer_groups == 2
