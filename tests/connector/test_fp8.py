"""FP8 (e4m3) KV pools through the harness: exact loads byte for byte, shifted loads within one fp8 step."""

from __future__ import annotations

import torch
from semblend_kernels.rope_delta import rotate_reference

from trtllm_connector.harness import PyExecutorHarness

from .conftest import decline_reason, prompt, records

FP8 = torch.float8_e4m3fn
SCALES = "0.02,0.5"  # one per layer (the stand-in has two)


def _bytes(kv: torch.Tensor) -> torch.Tensor:
    return kv.view(torch.uint8)


def test_exact_fp8_loads_are_byte_identical_with_or_without_a_scale(make_harness) -> None:
    for scale in (SCALES, None):
        h = make_harness(dtype=FP8, kv_scale=scale)
        donor = prompt(1, 100)
        h.run_request(donor)
        target = donor[:72] + prompt(2, 30)
        r = h.run_request(target)
        assert r.promised == 72
        assert torch.equal(_bytes(r.kv), _bytes(h.fresh_kv(target)))


def _assert_within_one_fp8_step(h: PyExecutorHarness, got: torch.Tensor, expected: torch.Tensor) -> None:
    """``got`` (fp8 codes) dequantized vs ``expected`` (fp32, real units): one e4m3 step at either magnitude."""
    scale = h.model.kv_scale.reshape(1, -1, 1, 1)  # type: ignore[attr-defined]
    actual = got.float() * scale
    info = torch.finfo(FP8)
    magnitude = torch.maximum(actual.abs(), expected.abs()) / scale
    step = info.eps * torch.exp2(torch.floor(torch.log2(magnitude.clamp_min(info.smallest_normal)))) * scale
    excess = ((actual - expected).abs() - step - 1e-6 * expected.abs()).max().item()
    assert excess <= 0, f"more than one fp8 step from the fp32 reference (excess {excess:.3g})"


def test_shifted_fp8_loads_are_within_one_step_of_fp32(make_harness) -> None:
    h = make_harness(
        dtype=FP8, kv_scale=SCALES, exact_materialization_only=False, isolation="no_block_reuse", context_free=True
    )
    shared = prompt(3, 64)
    d = h.run_request(prompt(4, 24) + shared)
    target = shared + prompt(5, 20)
    r = h.run_request(target)
    assert r.promised == 64
    [m] = records(h, "materialized", r.request_id)
    assert m.requires_rope_correction is True and m.delta == -24
    scale = h.model.kv_scale.reshape(1, -1, 1, 1)  # type: ignore[attr-defined]
    donor_k = d.kv[24:88, :, 0].float() * scale  # the donor's stored K, dequantized: the fp32 reference's input
    model = h.model
    expected_k = rotate_reference(
        donor_k,
        torch.full((64,), -24),
        model.inv_freq,
        model.rotary_dim,
        model.style,  # type: ignore[attr-defined]
    )
    _assert_within_one_fp8_step(h, r.kv[:64, :, 0], expected_k)
    assert torch.equal(_bytes(r.kv[:64, :, 1]), _bytes(d.kv[24:88, :, 1]))  # V: copied byte for byte


def test_shifted_fp8_without_a_scale_is_declined_with_a_reason(make_harness) -> None:
    h = make_harness(dtype=FP8, exact_materialization_only=False, isolation="no_block_reuse", context_free=True)
    shared = prompt(6, 64)
    h.run_request(prompt(7, 24) + shared)
    target = shared + prompt(8, 20)
    r = h.run_request(target)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "kv_scale_unknown"
    assert torch.equal(_bytes(r.kv), _bytes(h.fresh_kv(target)))
