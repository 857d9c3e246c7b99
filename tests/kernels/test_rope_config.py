"""RopeConfig from Hugging Face configs: inv_freq equal to transformers' own, refusals, fingerprints."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from semblend_kernels.rope import RopeConfig, UnsupportedRope
from transformers import GPTJConfig, GPTNeoXConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

BASE: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "max_position_embeddings": 131072,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
CASES: dict[str, dict[str, Any]] = {
    "default": {**BASE, "rope_theta": 1_000_000.0},
    "linear": {**BASE, "rope_theta": 10_000.0, "rope_scaling": {"type": "linear", "factor": 4.0}},
    "llama3": {**BASE, "rope_theta": 500_000.0, "rope_scaling": LLAMA3},
    "yarn": {**BASE, "rope_theta": 1_000_000.0, "rope_scaling": YARN},
    "yarn-v5-spelling": {
        **BASE,
        "rope_parameters": {
            "rope_theta": 1_000_000.0,
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "beta_fast": 16,
        },
    },
}


def hf_inv_freq_and_scaling(cfg: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """transformers' own inv_freq and attention factor for the same config (the independent oracle)."""
    rotary = LlamaRotaryEmbedding(LlamaConfig(**cfg))
    return rotary.inv_freq.float(), float(rotary.attention_scaling)


@pytest.mark.parametrize("name", CASES)
def test_inv_freq_matches_transformers(name: str) -> None:
    cfg = CASES[name]
    rope = RopeConfig.from_hf_config(cfg)
    expected, attention_scaling = hf_inv_freq_and_scaling(cfg)
    ours = rope.inv_freq()
    assert ours.dtype == torch.float32 and ours.shape == (64,)
    # Ours is computed in fp64 and rounded once; transformers computes in fp32: they agree to a few fp32 ulps.
    torch.testing.assert_close(ours, expected, rtol=5e-7, atol=0)
    assert rope.attention_factor == pytest.approx(attention_scaling)
    assert (rope.head_dim, rope.rotary_dim, rope.style) == (128, 128, "neox")


def test_config_object_and_partial_rotary_and_gptj() -> None:
    assert RopeConfig.from_hf_config(LlamaConfig(**CASES["llama3"])) == RopeConfig.from_hf_config(CASES["llama3"])
    neox = RopeConfig.from_hf_config(
        {
            "model_type": "gpt_neox",
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "rotary_pct": 0.25,
            "rotary_emb_base": 10000,
        }
    )
    assert (neox.head_dim, neox.rotary_dim, neox.base, neox.style) == (128, 32, 10000.0, "neox")
    phi = RopeConfig.from_hf_config(
        {
            "model_type": "phi",
            "hidden_size": 2560,
            "num_attention_heads": 32,
            "partial_rotary_factor": 0.4,
            "rope_theta": 10000.0,
        }
    )
    assert (phi.head_dim, phi.rotary_dim) == (80, 32)
    partial_inv = ROPE_INIT_FUNCTIONS["linear"](
        LlamaConfig(
            **{
                **BASE,
                "head_dim": 80,
                "rope_parameters": {
                    "rope_type": "linear",
                    "factor": 1.0,
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.4,
                },
            }
        )
    )[0]
    torch.testing.assert_close(phi.inv_freq(), partial_inv.float(), rtol=5e-7, atol=0)
    assert RopeConfig.from_hf_config(CASES["default"], style="gptj").style == "gptj"


def test_real_gptj_configs_as_transformers_writes_them() -> None:
    """GPT-J's config.json says n_embd / n_head (transformers maps them through ``attribute_map``)."""
    real = GPTJConfig().to_dict()  # 6B: n_embd 4096, n_head 16, rotary_dim 64
    assert "hidden_size" not in real and "num_attention_heads" not in real
    gptj = RopeConfig.from_hf_config(real)
    assert (gptj.head_dim, gptj.rotary_dim, gptj.base, gptj.style) == (256, 64, 10000.0, "gptj")
    assert RopeConfig.from_hf_config(GPTJConfig()) == gptj  # the config object reads the same
    full = RopeConfig.from_hf_config({**GPTJConfig(n_embd=1024, n_head=8).to_dict(), "rotary_dim": None})
    assert (full.head_dim, full.rotary_dim) == (128, 128)  # rotary_dim None: the whole head rotates
    # GPT-J's rotary base is fixed at 10000 in transformers' modeling code, whatever the config says.
    assert RopeConfig.from_hf_config({**real, "rope_theta": 5e5}).base == 10000.0


def test_real_gpt_neox_configs_new_and_legacy_spellings() -> None:
    current = GPTNeoXConfig().to_dict()  # 20B: hidden 6144, 64 heads, rope_parameters.partial_rotary_factor 0.25
    neox = RopeConfig.from_hf_config(current)
    assert (neox.head_dim, neox.rotary_dim, neox.base, neox.style) == (96, 24, 10000.0, "neox")
    legacy = {k: v for k, v in current.items() if k != "rope_parameters"}  # pythia-era config.json
    legacy.update(rotary_pct=0.25, rotary_emb_base=10000)
    assert RopeConfig.from_hf_config(legacy) == neox
    base = RopeConfig.from_hf_config({**legacy, "rotary_emb_base": 25000}).base
    assert base == 25000.0


def test_longrope_only_within_its_short_regime() -> None:
    cfg: dict[str, Any] = {
        "model_type": "phi3",
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0 + i / 100 for i in range(48)],
            "long_factor": [2.0] * 48,
        },
    }
    with pytest.raises(UnsupportedRope, match="LongRoPE"):
        RopeConfig.from_hf_config(cfg)
    with pytest.raises(UnsupportedRope, match="LongRoPE"):
        RopeConfig.from_hf_config(cfg, max_position=8192)
    rope = RopeConfig.from_hf_config(cfg, max_position=4096)
    hf = LlamaConfig(**{**cfg, "model_type": "llama"})
    expected, attention = ROPE_INIT_FUNCTIONS["longrope"](hf)
    torch.testing.assert_close(rope.inv_freq(), expected.float(), rtol=5e-7, atol=0)
    assert rope.attention_factor == pytest.approx(attention)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({**BASE, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
        ({**BASE, "rope_scaling": {"rope_type": "mrope", "mrope_section": [16, 24, 24]}}, "not supported"),
        ({**BASE, "rope_scaling": {"rope_type": "default", "mrope_section": [16, 24, 24]}}, "mRoPE"),
        (
            {
                **BASE,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default"},
                    "sliding_attention": {"rope_type": "default"},
                },
            },
            "per-layer",
        ),
        ({**BASE, "no_rope_layers": [1, 1, 0, 1]}, "without RoPE"),
        ({**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"model_type": "llama"}, "head_dim"),
        ({**BASE, "partial_rotary_factor": 0.0}, "rotary_dim"),
    ],
)
def test_unsupported_rope_is_refused(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedRope, match=message):
        RopeConfig.from_hf_config(cfg)


def test_fingerprint_separates_everything_that_changes_k() -> None:
    configs = [RopeConfig.from_hf_config(cfg) for cfg in CASES.values()]
    configs += [
        RopeConfig(128, 128, 1e6, "gptj"),
        RopeConfig(128, 64, 1e6),
        RopeConfig(128, 128, 1e6 + 1),
    ]
    fingerprints = [c.fingerprint() for c in configs]
    assert len(set(fingerprints)) == len(fingerprints)
    assert (
        RopeConfig.from_hf_config(CASES["yarn"]).fingerprint()
        == RopeConfig.from_hf_config(dict(CASES["yarn"])).fingerprint()
    )
    assert RopeConfig(128, 128, 1e6).fingerprint() == RopeConfig.from_hf_config(CASES["default"]).fingerprint()
