"""Materialization through the PyExecutor harness: exact, shifted, modes and namespaces."""

from __future__ import annotations

import pytest
import torch

from semblend_dynamo.config import ConfigError, SemblendConfig
from semblend_dynamo.events.schemas import DonorHint, request_key
from trtllm_connector.connector import SemBlendConnectorScheduler
from trtllm_connector.harness import HarnessLlmArgs, PyExecutorHarness
from trtllm_connector.model_info import ModelInfo

from .conftest import BLOCK, decline_reason, prompt, records, relative_error


def test_exact_mode_materializes_bit_identical_kv(make_harness) -> None:
    h = make_harness()
    donor = prompt(1, 100)
    assert h.run_request(donor).pinned
    target = donor[:72] + prompt(2, 30)
    r = h.run_request(target)
    assert r.promised == 72  # 9 whole blocks of the shared prefix
    assert len(r.connector_written_blocks) == 72 // BLOCK
    assert torch.equal(r.kv, h.fresh_kv(target))
    [m] = records(h, "materialized", r.request_id)
    assert m.materialized == 72 and m.requires_rope_correction is False and m.delta == 0


def test_exact_mode_leaves_one_prompt_token_uncomputed(make_harness) -> None:
    h = make_harness()
    donor = prompt(3, 64)
    h.run_request(donor)
    r = h.run_request(donor)  # the same prompt again: everything matches
    assert r.promised == 56  # 64 - 1 rounded down to whole blocks
    assert torch.equal(r.kv, h.fresh_kv(donor))


def test_exact_mode_declines_shifted_spans(make_harness) -> None:
    h = make_harness()
    shared = prompt(4, 64)
    h.run_request(prompt(5, 24) + shared)
    r = h.run_request(shared + prompt(6, 20))
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "no_candidate"  # exact mode searches shared prefixes only
    assert torch.equal(r.kv, h.fresh_kv(shared + prompt(6, 20)))


def test_exact_mode_declines_a_hinted_shifted_span(make_harness) -> None:
    h = make_harness()
    shared = prompt(4, 64)
    d = h.run_request(prompt(5, 24) + shared)
    target = shared + prompt(6, 20)
    h.scheduler.hints.submit(
        DonorHint(
            request_key=request_key(target),
            donor_id=h.scheduler.registry.donor_id_for(d.request_id),
            worker_id=0,
            namespace=h.scheduler.model.namespace().digest(),
            spans=[(24, 0, 64)],
            decision="semantic_placement",
        )
    )
    r = h.run_request(target)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "exact_only_mode"


def _assert_shift_within_bf16(h: PyExecutorHarness, target: list[int], r, start: int) -> None:
    positions = list(range(start, start + r.promised))
    exact = h.model.kv_fp32([target[p] for p in positions], positions)
    got = r.kv[start : start + r.promised]
    rounding = relative_error(exact.to(torch.bfloat16), exact)
    assert relative_error(got[:, :, 0], exact[:, :, 0]) <= 1.5 * rounding  # K: rotated by the delta
    assert torch.equal(got[:, :, 1], exact[:, :, 1].to(torch.bfloat16))  # V: copied unchanged


@pytest.mark.parametrize("isolation", ["no_block_reuse", "cache_salt"])
def test_shifted_mode_matches_fresh_k_within_bf16_rounding(make_harness, isolation: str) -> None:
    # The copy itself is checked against the context-free oracle: only there is a shifted K exactly R(delta) K.
    h = make_harness(exact_materialization_only=False, isolation=isolation, context_free=True)
    shared = prompt(7, 64)
    h.run_request(prompt(8, 24) + shared, cache_salt="tenantA|d1")
    target = shared + prompt(9, 20)
    r = h.run_request(target, cache_salt="tenantA|t1")
    assert r.promised == 64
    [m] = records(h, "materialized", r.request_id)
    assert m.requires_rope_correction is True and m.delta == -24
    _assert_shift_within_bf16(h, target, r, 0)


def test_a_router_hint_finds_the_donor_by_its_prompt_key(make_harness) -> None:
    """The router names a donor ``<worker>:<namespace>:<key>`` and by ``donor_key``; the connector's ids differ."""
    h = make_harness(exact_materialization_only=False, isolation="no_block_reuse")
    shared = prompt(15, 64)
    donor = prompt(16, 24) + shared
    assert h.run_request(donor).pinned
    namespace = h.scheduler.model.namespace().digest()
    target = shared + prompt(17, 20)
    for key, trace in ((request_key(donor), "trace-found"), (request_key(prompt(18, 88)), "trace-unknown")):
        h.scheduler.hints.submit(
            DonorHint(
                request_key=request_key(target),
                donor_id=f"0:{namespace}:{key}",
                donor_key=key,
                worker_id=0,
                namespace=namespace,
                spans=[(24, 0, 64)],
                decision="semantic_placement",
                trace_id=trace,
            )
        )
        r = h.run_request(target)
        if trace == "trace-found":
            [m] = records(h, "materialized", r.request_id)
            assert r.promised == 64 and m.trace_id == trace and m.role == "recipient"
        else:
            assert r.promised == 0 and decline_reason(h, r.request_id) == "donor_not_resident"


def test_shifted_span_after_a_device_prefix_moves_forward(make_harness) -> None:
    h = make_harness(
        exact_materialization_only=False,
        isolation="cache_salt",
        prefix_reuse=True,
        max_deviation=0.9,
        context_free=True,
    )
    system = prompt(10, 16)
    shared = prompt(11, 64)
    conversation = "tenantA|conv1"  # one conversation's turns share their salt, so its prefix cache
    h.run_request(system + prompt(12, 40), cache_salt=conversation)  # leaves the system prompt in the device cache
    h.run_request(shared + prompt(13, 40), cache_salt="tenantA|d1")  # the donor of the shared text, at position 0
    target = system + shared + prompt(14, 9)
    r = h.run_request(target, cache_salt=conversation)
    assert r.device_matched == 16 and r.promised == 64
    assert records(h, "materialized", r.request_id)[0].delta == 16
    _assert_shift_within_bf16(h, target, r, 16)


def test_cache_salt_isolation_needs_a_per_request_nonce(make_harness) -> None:
    h = make_harness(exact_materialization_only=False, isolation="cache_salt")
    shared = prompt(15, 64)
    h.run_request(prompt(16, 24) + shared, cache_salt="tenantA")
    r = h.run_request(shared + prompt(17, 20), cache_salt="tenantA")
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "isolation_required"


def test_shifted_mode_without_isolation_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="SEMBLEND_ISOLATION"):  # by the config the connector loads
        SemBlendConnectorScheduler(
            HarnessLlmArgs(BLOCK),
            config=SemblendConfig.validated({"block_size": BLOCK, "exact_materialization_only": False}),
        )


def test_block_size_must_agree_with_the_engine() -> None:
    with pytest.raises(ConfigError, match="tokens_per_block"):
        SemBlendConnectorScheduler(HarnessLlmArgs(16), config=SemblendConfig(block_size=BLOCK))


def test_discovery_only_never_promises(make_harness) -> None:
    h = make_harness(discovery_only=True)
    donor = prompt(18, 100)
    results = [h.run_request(donor[: 60 + i] + prompt(100 + i, 20)) for i in range(6)]
    assert all(r.promised == 0 and r.connector_written_blocks == [] for r in results)
    assert {decline_reason(h, r.request_id) for r in results[1:]} == {"discovery_only"}
    assert any(rec.found for rec in records(h, "lookup"))  # the lookup itself still ran
    assert records(h, "materialized") == [] and records(h, "promised") == []


@pytest.mark.parametrize(
    ("donor_salt", "target_salt"), [("tenantA|1", "tenantB|2"), (None, "tenantB|2"), ("tenantA|1", None)]
)
def test_donors_never_cross_tenants(make_harness, donor_salt, target_salt) -> None:
    h = make_harness()
    donor = prompt(19, 100)
    h.run_request(donor, cache_salt=donor_salt)
    r = h.run_request(donor[:72] + prompt(20, 30), cache_salt=target_salt)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert records(h, "lookup", r.request_id)[0].found is False


def test_same_tenant_different_nonce_shares_donors(make_harness) -> None:
    h = make_harness()
    donor = prompt(21, 100)
    h.run_request(donor, cache_salt="tenantA|1")
    r = h.run_request(donor[:72] + prompt(22, 30), cache_salt="tenantA|2")
    assert r.promised == 72


def test_lora_adapter_is_part_of_the_namespace(make_harness) -> None:
    h = make_harness()
    donor = prompt(23, 100)
    h.run_request(donor)
    sched = h.scheduler
    plain = sched.model.namespace().digest()
    adapted = sched.model.namespace(lora="7").digest()
    assert plain != adapted
    spans = sched.aligner.align(adapted, donor[:72] + prompt(24, 30))
    assert spans == []  # the donor is indexed under the adapter-free namespace only


def test_short_finished_requests_do_not_become_donors(make_harness) -> None:
    h = make_harness(min_donor_tokens=64)
    assert h.run_request(prompt(25, 40)).pinned is False
    assert h.run_request(prompt(26, 80)).pinned is True


def test_router_and_connector_build_the_same_namespace(make_harness) -> None:
    h = make_harness()
    router_side = ModelInfo.load(h.scheduler.cfg)  # a router has no llm_args, only the shared settings
    assert router_side.namespace(tenant="t").digest() == h.scheduler.model.namespace(tenant="t").digest()
    assert router_side.rope_fingerprint != ""  # SEMBLEND_ROPE_CONFIG is set: the fingerprint is in the key


def test_rope_from_the_model_dir_is_not_in_the_namespace(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 32}'
    )
    cfg = SemblendConfig(block_size=BLOCK)
    engine_side = ModelInfo.load(cfg, HarnessLlmArgs(BLOCK, model=str(tmp_path)))
    assert engine_side.shift_supported and engine_side.head_dim == 16 and engine_side.num_kv_heads == 2
    assert engine_side.namespace().digest() == ModelInfo.load(cfg).namespace().digest()


def test_disabled_connector_neither_promises_nor_pins(make_harness) -> None:
    h = make_harness(enabled=False)
    donor = prompt(27, 100)
    assert h.run_request(donor).pinned is False
    r = h.run_request(donor[:72] + prompt(28, 30))
    assert r.promised == 0 and decline_reason(h, r.request_id) == "semantic_disabled"


def test_shifted_kv_of_a_context_dependent_model_differs_from_a_fresh_prefill(make_harness) -> None:
    h = make_harness(exact_materialization_only=False, isolation="cache_salt")
    shared = prompt(7, 64)
    h.run_request(prompt(8, 24) + shared, cache_salt="tenantA|d1")
    target = shared + prompt(9, 20)
    r = h.run_request(target, cache_salt="tenantA|t1")
    assert r.promised == 64
    [m] = records(h, "materialized", r.request_id)
    assert m.lineage == "approximate" and m.requires_rope_correction is True
    error = (r.kv.float() - h.fresh_kv(target).float()).abs().amax().item()
    assert error > 0.1  # the first shifted tokens followed other context in the donor


def test_a_real_gptj_config_supports_shifted_spans(tmp_path) -> None:
    from transformers import GPTJConfig

    from trtllm_connector.model_info import ModelInfo

    real = GPTJConfig().to_json_string(use_diff=False)  # n_embd / n_head / rotary_dim, no hidden_size
    cfg = SemblendConfig(block_size=BLOCK, rope_config=real)
    info = ModelInfo.load(cfg, HarnessLlmArgs(BLOCK))
    assert info.shift_supported, info.rope_unsupported
    assert (info.num_kv_heads, info.head_dim, info.rotary_dim, info.rope_style) == (16, 256, 64, "gptj")
