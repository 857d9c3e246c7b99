"""Exactness: K computed at the donor's positions and moved by the kernel vs K computed fresh at the target's.

The fresh-K oracle is transformers' own RoPE (LlamaRotaryEmbedding's inv_freq and attention scaling with
apply_rotary_pos_emb / rotate_half; GPT-J's apply_rotary_pos_emb / rotate_every_two), evaluated in fp64. The donor K is
stored in bf16 (as the KV cache holds it); the kernel's output must be within 1.5x of the bf16 round-trip error of
fresh K, for plain, llama3 and YaRN RoPE.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from semblend_kernels.layout import PagedKVLayout
from semblend_kernels.rope import RopeConfig
from semblend_kernels.rope_delta import CopySpan, rope_delta_copy, split_spans_to_plan
from transformers import GPTJConfig, LlamaConfig
from transformers.models.gptj import modeling_gptj
from transformers.models.llama import modeling_llama

from tests.kernels.support import TRITON_DEVICES

HEADS, HEAD_DIM, T = 4, 128, 16
MODEL = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": HEADS,
    "max_position_embeddings": 131072,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {**MODEL, "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}},
    "llama3": {
        **MODEL,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "yarn": {
        **MODEL,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 1_000_000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    },
}
# (donor start position, target start position, tokens): shifts forward, backward, by one, and by ~8K.
SPANS = [(0, 4113, 40), (5000, 1999, 24), (300, 301, 32), (9000, 17192, 32)]


def raw_keys(n_tokens: int) -> torch.Tensor:
    """Pre-RoPE K ``[1, H, N, D]`` (fp64): Gaussian with a few large outlier channels, as real K has."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, HEADS, n_tokens, HEAD_DIM, generator=g, dtype=torch.float64)
    k[..., torch.tensor([3, 17, 70, 101])] *= 15
    return k


def llama_fresh_k(cfg: dict[str, Any], k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """transformers' Llama RoPE in fp64: cos/sin from its inv_freq and attention scaling, then apply_rotary_pos_emb."""
    rotary = modeling_llama.LlamaRotaryEmbedding(LlamaConfig(**cfg))
    freqs = positions.double()[:, None] * rotary.inv_freq.double()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[None]  # [1, N, D]
    cos, sin = emb.cos() * rotary.attention_scaling, emb.sin() * rotary.attention_scaling
    # Its own fp32 forward agrees (guards against reading the module wrongly).
    cos32, _ = rotary(k.float(), positions[None])
    torch.testing.assert_close(cos32.double(), cos, atol=2e-3, rtol=0)
    _, fresh = modeling_llama.apply_rotary_pos_emb(k, k, cos, sin)
    return fresh


def gptj_fresh_k(k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """transformers' GPT-J RoPE (interleaved pairs) in fp64 with base 10000 over the whole head."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    angles = positions.double()[None, :, None] * inv_freq  # [1, N, D/2]
    fresh = modeling_gptj.apply_rotary_pos_emb(k.transpose(1, 2), angles.sin(), angles.cos())  # [1, N, H, D]
    return fresh.transpose(1, 2)


def move_with_kernel(donor_k: torch.Tensor, rope: RopeConfig, device: str, style: str) -> torch.Tensor:
    """Store bf16 donor K in donor blocks, run rope_delta_copy per SPANS, read K back from the target blocks."""
    layout = PagedKVLayout(num_layers=1, num_kv_heads=HEADS, head_dim=HEAD_DIM, tokens_per_block=T)
    n = donor_k.shape[2]
    n_blocks = n // T
    pool = torch.zeros(2 * n_blocks, 1, 2, layout.block_elems, dtype=torch.bfloat16, device=device)
    view = layout.view(pool)  # [NB, 1, 2, H, T, D]
    view[:n_blocks, 0, 0] = (
        donor_k[0].to(torch.bfloat16).reshape(HEADS, n_blocks, T, HEAD_DIM).transpose(0, 1).to(device)
    )
    spans, start = [], 0
    for donor_pos, target_pos, length in SPANS:
        spans.append(CopySpan(start, start, length, delta=target_pos - donor_pos))
        start += length
    plan = split_spans_to_plan(spans, list(range(n_blocks)), list(range(n_blocks, 2 * n_blocks)), T)
    rope_delta_copy(pool, plan, rope.inv_freq(device), layout, rotary_dim=rope.rotary_dim, style=style)  # type: ignore[arg-type]
    return view[n_blocks:, 0, 0].transpose(0, 1).reshape(1, HEADS, n, HEAD_DIM).double().cpu()


def positions() -> tuple[torch.Tensor, torch.Tensor]:
    donor = torch.cat([torch.arange(d, d + n) for d, _, n in SPANS])
    target = torch.cat([torch.arange(t, t + n) for _, t, n in SPANS])
    return donor, target


def relative_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return float((x - reference).norm() / reference.norm())


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("name", CONFIGS)
def test_moved_k_is_as_exact_as_bf16_allows(device: str, name: str) -> None:
    cfg = CONFIGS[name]
    rope = RopeConfig.from_hf_config(cfg)
    donor_pos, target_pos = positions()
    k = raw_keys(donor_pos.numel())
    fresh_target = llama_fresh_k(cfg, k, target_pos)
    moved = move_with_kernel(llama_fresh_k(cfg, k, donor_pos), rope, device, "neox")
    floor = relative_error(fresh_target.to(torch.bfloat16).double(), fresh_target)
    error = relative_error(moved, fresh_target)
    assert error <= 1.5 * floor, f"{name}: error {error:.3g} vs bf16 round trip {floor:.3g}"
    # Negative control: the wrong pairing (the classic GPT-J-for-NeoX bug) is caught by the same measure.
    wrong = move_with_kernel(llama_fresh_k(cfg, k, donor_pos), rope, device, "gptj")
    assert relative_error(wrong, fresh_target) > 50 * floor


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_gptj_pairing_is_as_exact_as_bf16_allows(device: str) -> None:
    rope = RopeConfig.from_hf_config(GPTJConfig(n_embd=512, n_head=4, rotary_dim=HEAD_DIM).to_dict())
    assert rope.style == "gptj"
    donor_pos, target_pos = positions()
    k = raw_keys(donor_pos.numel())
    fresh_target = gptj_fresh_k(k, target_pos)
    moved = move_with_kernel(gptj_fresh_k(k, donor_pos), rope, device, "gptj")
    floor = relative_error(fresh_target.to(torch.bfloat16).double(), fresh_target)
    assert relative_error(moved, fresh_target) <= 1.5 * floor
