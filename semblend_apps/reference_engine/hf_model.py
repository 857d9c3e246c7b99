"""The Hugging Face side of the reference engine: load a causal LM, prefill with or without past KV, decode greedily.

Any ``transformers`` causal-LM directory works as long as its attention keeps a standard per-layer K/V cache
(``DynamicCache``); the RoPE delta correction further needs a RoPE the kernels accept
(``semblend_kernels.rope.RopeConfig.from_hf_config``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's (K, V), each ``[1, kv_heads, seq, head_dim]``."""


@dataclass(frozen=True)
class KVGeometry:
    """The per-token KV shape of a model."""

    num_layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> KVGeometry:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return cls(text.num_hidden_layers, getattr(text, "num_key_value_heads", None) or heads, head_dim)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * torch.finfo(dtype).bits // 8


LOWER_RIGHT_SDPA = "sdpa_lower_right"
"""Attention implementation name: SDPA with a bottom-right aligned causal mask (see :func:`sdpa_lower_right`)."""


def sdpa_lower_right(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal SDPA for queries that follow a cached prefix, without a materialized mask.

    Hugging Face's ``sdpa`` builds a boolean ``[q, k]`` mask whenever the queries do not start at position 0,
    which rules out the flash kernel; a prefill after a cached prefix is exactly what TensorRT-LLM's context FMHA
    runs natively. ``causal_lower_right`` keeps SDPA on its fused kernels, and grouped K/V heads are passed as they
    are (``enable_gqa``) rather than repeated. No mask is built for it (the implementation is not registered with
    Hugging Face's mask interface), so single requests only (no padding).
    """
    from torch.nn.attention.bias import causal_lower_right

    gqa = query.shape[1] != key.shape[1]
    q_len, k_len = query.shape[2], key.shape[2]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if q_len == k_len:
        out = sdpa(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    elif q_len == 1:
        out = sdpa(query, key, value, scale=scaling, enable_gqa=gqa)
    else:
        bias = causal_lower_right(q_len, k_len)
        out = sdpa(query, key, value, attn_mask=bias, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(LOWER_RIGHT_SDPA, sdpa_lower_right)


def load_model(model_dir: str | Path, device: str, dtype: torch.dtype = torch.bfloat16, attn: str = "sdpa") -> Any:
    """``AutoModelForCausalLM`` from a local directory, in eval mode, with ``attn`` attention."""
    from transformers import AutoModelForCausalLM

    if attn == LOWER_RIGHT_SDPA:
        _register_attention()
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation=attn)
    return model.to(device).eval()


def random_llama(
    config_overrides: dict[str, Any], device: str, dtype: torch.dtype = torch.bfloat16, attn: str = "sdpa"
) -> Any:
    """A random-weight ``LlamaForCausalLM`` (for speed runs), built directly on ``device`` in ``dtype``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if attn == LOWER_RIGHT_SDPA:
        _register_attention()
    config = LlamaConfig(**{"attn_implementation": attn, **config_overrides})
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def cache_layers(cache: Any) -> list[LayerKV]:
    """Per-layer (K, V) of a ``transformers`` cache (both the 5.x ``layers`` and the 4.x ``key_cache`` spellings)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


def cache_from_layers(layers: list[LayerKV], config: Any) -> Any:
    """A ``DynamicCache`` holding ``layers`` as past KV."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for idx, (k, v) in enumerate(layers):
        cache.update(k, v, idx)
    return cache


@torch.inference_mode()
def prefill(model: Any, input_ids: torch.Tensor, past: Any | None = None, keep: int = 1) -> tuple[torch.Tensor, Any]:
    """Run ``input_ids`` (1-D) after ``past``; return fp32 logits of the last ``keep`` positions and the cache."""
    if past is None:
        from transformers import DynamicCache

        past = DynamicCache(config=model.config)
    out = model(input_ids=input_ids.unsqueeze(0), past_key_values=past, use_cache=True, logits_to_keep=keep)
    return out.logits[0].float(), out.past_key_values


@torch.inference_mode()
def greedy(model: Any, cache: Any, last_logits: torch.Tensor, steps: int) -> list[int]:
    """``steps`` greedy tokens continuing from ``cache`` whose last position produced ``last_logits``."""
    tokens: list[int] = []
    logits = last_logits
    for _ in range(steps):
        nxt = int(torch.argmax(logits))
        tokens.append(nxt)
        if len(tokens) == steps:
            break
        out = model(input_ids=torch.tensor([[nxt]], device=cache_layers(cache)[0][0].device), past_key_values=cache)
        logits = out.logits[0, -1].float()
    return tokens


def truncated(cache: Any, num_tokens: int, config: Any) -> Any:
    """A new ``DynamicCache`` with the first ``num_tokens`` of ``cache`` (``crop``'s signature differs across versions)."""
    return cache_from_layers([(k[:, :, :num_tokens], v[:, :, :num_tokens]) for k, v in cache_layers(cache)], config)
