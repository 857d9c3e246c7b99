"""The worker's CUDA path (Triton kernel on the forward stream, CUDA event before `materialized`) on a real GPU."""

from __future__ import annotations

import pytest
import torch

from semblend_dynamo.config import SemblendConfig
from trtllm_connector.harness import PyExecutorHarness

from .conftest import BASE_SETTINGS, prompt, records, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _harness(**settings) -> PyExecutorHarness:
    cfg = SemblendConfig(**{**BASE_SETTINGS, "block_size": 32, "min_span_tokens": 64, **settings})
    return PyExecutorHarness.with_stand_in(
        cfg,
        num_blocks=512,
        num_layers=4,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        device="cuda",
        context_free=True,  # the shifted copy is checked against the bit-exact-shift oracle
    )


def test_exact_copy_on_cuda_is_bit_identical() -> None:
    h = _harness()
    donor = prompt(1, 700)
    h.run_request(donor)
    target = donor[:512] + prompt(2, 100)
    r = h.run_request(target)
    assert r.promised == 512
    assert torch.equal(r.kv, h.fresh_kv(target))
    assert records(h, "materialized", r.request_id)[0].materialized == 512


def test_shifted_copy_on_cuda_uses_the_triton_kernel_within_bf16_rounding() -> None:
    h = _harness(exact_materialization_only=False, isolation="no_block_reuse", max_deviation=0.9)
    shared = prompt(3, 512)
    h.run_request(prompt(4, 96) + shared)
    target = shared + prompt(5, 100)
    r = h.run_request(target)
    assert r.promised == 512
    positions = list(range(512))
    exact = h.model.kv_fp32(shared, positions)
    got = r.kv[:512].cpu()
    rounding = relative_error(exact.to(torch.bfloat16), exact)
    assert relative_error(got[:, :, 0], exact[:, :, 0]) <= 1.5 * rounding
    assert torch.equal(got[:, :, 1], exact[:, :, 1].to(torch.bfloat16))
    assert records(h, "materialized", r.request_id)[0].delta == -96
