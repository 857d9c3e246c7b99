"""What the connector must know about the engine and the model, read once at start-up.

From TensorRT-LLM's ``llm_args`` (read with ``getattr``: fields differ across versions): tokens per block,
the attention backend (head-major blocks for ``TRTLLM``, token-major otherwise), the KV dtype, the
tensor-parallel size and the number of KV layer groups (distinct ``kv_cache_config.max_attention_window`` sizes:
more than one is variable sliding-window attention, which the connector declines). For an fp8 KV cache the
dequantization scale comes from ``SEMBLEND_KV_SCALE`` (the connector API does not expose the attention layers'
``kv_scale_quant_orig``); without it shifted loads are declined and exact loads stay byte copies. From the model's Hugging Face ``config.json`` (``SEMBLEND_ROPE_CONFIG``, a path or inline
JSON, else ``<model dir>/config.json``): the RoPE configuration and the KV head geometry. Anything missing or
unsupported is recorded as a reason, so the scheduler declines the requests that would need it instead of failing.
The namespace key carries the RoPE fingerprint only when it comes from ``SEMBLEND_ROPE_CONFIG``, the setting routers
share (see :meth:`ModelInfo.namespace`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from semblend_kernels.rope import hf_config_dict

from semblend_dynamo.config import ConfigError, SemblendConfig, parse_kv_scale
from semblend_dynamo.namespace import ModelIdentity, NamespaceKey, read_model_config
from semblend_dynamo.tokenizer import tokenizer_fingerprint


class ModelInfo(BaseModel):
    """Engine and model facts the connector's decisions depend on."""

    model_config = ConfigDict(frozen=True)

    model_id: str
    tokens_per_block: int
    kv_dtype: str
    layout_order: str  # "head_major" | "token_major"
    tp_size: int = 1
    num_kv_heads: int | None = None  # local to one tensor-parallel rank
    head_dim: int | None = None
    tokenizer_fingerprint: str = ""
    rope_fingerprint: str = ""
    rotary_dim: int | None = None
    rope_style: str | None = None
    inv_freq: tuple[float, ...] | None = None
    rope_unsupported: str | None = None
    """Why shifted spans cannot be corrected (None when they can)."""
    kv_scale: tuple[float, ...] | None = None
    """fp8 KV: the dequantization scale (one for the pool, or one per layer); None when not known or not fp8."""
    layer_groups: int = 1
    """KV layer groups (one per attention window size); the connector serves one only."""

    @property
    def fp8(self) -> bool:
        return self.kv_dtype == "fp8"

    @property
    def kv_scale_missing(self) -> bool:
        """An fp8 cache without a known scale: K cannot be rotated, only copied byte for byte."""
        return self.fp8 and self.kv_scale is None

    @property
    def shift_supported(self) -> bool:
        return self.rope_unsupported is None

    @property
    def identity(self) -> ModelIdentity:
        """The deployment-wide part of this engine's namespace keys (the same one routers derive from the settings)."""
        return ModelIdentity(
            model_id=self.model_id,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            tokens_per_block=self.tokens_per_block,
            kv_dtype=self.kv_dtype,
            layout_order=self.layout_order,
            rope_fingerprint=self.rope_fingerprint,
        )

    def namespace(self, *, lora: str = "", tenant: str = "") -> NamespaceKey:
        """The namespace key of one request on this engine."""
        return self.identity.namespace(lora=lora, tenant=tenant)

    @classmethod
    def load(cls, cfg: SemblendConfig, llm_args: Any = None) -> ModelInfo:
        """Read ``llm_args`` and the model config. Raises :class:`ConfigError` when the block size disagrees."""
        kv_cfg = getattr(llm_args, "kv_cache_config", None)
        tpb = int(getattr(kv_cfg, "tokens_per_block", None) or cfg.block_size)
        if tpb != cfg.block_size:
            raise ConfigError(
                f"SEMBLEND_BLOCK_SIZE={cfg.block_size} but the engine's kv_cache_config.tokens_per_block is {tpb}; "
                "they must agree so router hints and donors use the same blocks"
            )
        engine_dtype = str(getattr(kv_cfg, "dtype", "auto") or "auto")
        kv_dtype = cfg.kv_dtype if engine_dtype == "auto" else engine_dtype
        backend = str(getattr(llm_args, "attn_backend", "TRTLLM") or "TRTLLM")
        order = "head_major" if backend.upper() == "TRTLLM" else "token_major"
        tp = _tp_size(llm_args)
        hf, source_error = _hf_config(cfg, llm_args)
        values: dict[str, Any] = {
            "model_id": cfg.model_id,
            "tokens_per_block": tpb,
            "kv_dtype": kv_dtype,
            "layout_order": order,
            "tp_size": tp,
            "tokenizer_fingerprint": tokenizer_fingerprint(cfg.tokenizer),
            "layer_groups": _layer_groups(kv_cfg),
        }
        if kv_dtype == "fp8" and cfg.kv_scale is not None:
            values["kv_scale"] = parse_kv_scale(cfg.kv_scale)
        if hf is None:
            values["rope_unsupported"] = source_error
            return cls(**values)
        hf = hf_config_dict(hf)  # GPT-J's n_embd / n_head read as transformers reads them
        heads = hf.get("num_key_value_heads") or hf.get("num_attention_heads")
        if heads:
            values["num_kv_heads"] = max(1, int(heads) // tp)
        values.update(_rope_values(hf))
        if cfg.rope_config is None:
            # Routers see only SEMBLEND_ROPE_CONFIG: a fingerprint from the engine's model dir would make every hint's
            # namespace differ from ours. One worker serves one model, so its donors still share one RoPE.
            values["rope_fingerprint"] = ""
        if values.get("head_dim") is None and hf.get("hidden_size") and hf.get("num_attention_heads"):
            values["head_dim"] = int(hf["hidden_size"]) // int(hf["num_attention_heads"])
        return cls(**values)


def _layer_groups(kv_cfg: Any) -> int:
    """Distinct attention window sizes in ``kv_cache_config.max_attention_window`` (1 when unset or uniform)."""
    windows = getattr(kv_cfg, "max_attention_window", None)
    if isinstance(windows, (list, tuple)) and windows:
        return len({int(w) for w in windows})
    return 1


def _tp_size(llm_args: Any) -> int:
    for owner in (llm_args, getattr(llm_args, "parallel_config", None)):
        for name in ("tensor_parallel_size", "tp_size"):
            value = getattr(owner, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return 1


def _hf_config(cfg: SemblendConfig, llm_args: Any) -> tuple[dict[str, Any] | None, str]:
    """The model's config.json as a dict, or None and why."""
    source = cfg.rope_config
    if source is None:
        model = getattr(llm_args, "model", None)
        candidate = Path(str(model)) / "config.json" if model else None
        if candidate is None or not candidate.is_file():
            return None, "no model config (set SEMBLEND_ROPE_CONFIG to the model's config.json)"
        source = str(candidate)
    return read_model_config(source), ""


def _rope_values(hf: dict[str, Any]) -> dict[str, Any]:
    try:
        from semblend_kernels.rope import RopeConfig, UnsupportedRope
    except ImportError as exc:  # pragma: no cover - semblend_kernels ships with this package
        return {"rope_unsupported": f"semblend_kernels missing: {exc}"}
    try:
        rope = RopeConfig.from_hf_config(hf)
    except UnsupportedRope as exc:
        return {"rope_unsupported": str(exc)}
    return {
        "head_dim": rope.head_dim,
        "rope_fingerprint": rope.fingerprint(),
        "rotary_dim": rope.rotary_dim,
        "rope_style": rope.style,
        "inv_freq": tuple(float(x) for x in rope.inv_freq().tolist()),
    }
