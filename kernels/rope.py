"""A model's rotary-embedding (RoPE) configuration and its inverse frequencies.

`RopeConfig.from_hf_config` reads a Hugging Face-style ``config.json`` (both the transformers 4.x ``rope_scaling`` and
the 5.x ``rope_parameters`` spellings) and refuses, with `UnsupportedRope`, every variant for which a single rotation by
the position delta is not exact: dynamic NTK (the base depends on the running sequence length), LongRoPE across its
short/long threshold, mRoPE, per-layer-type RoPE and models with RoPE-free layers.

A RoPE delta correction must rotate with *unit* cos/sin: YaRN and LongRoPE fold an attention factor (mscale) into the
cos/sin the model uses, so cached K already carries it once. `attention_factor` records it; nothing here applies it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

RopeStyle = Literal["neox", "gptj"]
ScalingParams = tuple[tuple[str, Any], ...]

# Models whose rotary pairs are interleaved (2i, 2i+1); every other model pairs i with i + rotary_dim/2 (GPT-NeoX).
_INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "codegen", "cohere", "cohere2"})
_SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn", "longrope"})
_HF_DEFAULT_THETA = 10000.0  # transformers' default when a config names no rope_theta (GPT-J, LLaMA-1)
_FIXED_BASE_MODEL_TYPES = frozenset({"gptj", "codegen"})
"""transformers' modeling code for these builds its sinusoids with base 10000 and reads no theta from the config."""
_HF_ATTRIBUTE_MAP = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}
"""GPT-J / CodeGen ``config.json`` spellings, mapped the way their configs' ``attribute_map`` does."""


class UnsupportedRope(ValueError):
    """The model's RoPE cannot be corrected by a single rotation by the position delta."""


def hf_config_dict(cfg: Mapping[str, Any] | Any) -> dict[str, Any]:
    """A Hugging Face config (``config.json`` mapping or ``PretrainedConfig``) with the standard attribute names.

    GPT-J-style configs say ``n_embd`` / ``n_head`` / ``n_layer``; transformers reads them as ``hidden_size`` /
    ``num_attention_heads`` / ``num_hidden_layers`` (``attribute_map``), and so does this.
    """
    conf = dict(cfg if isinstance(cfg, Mapping) else cfg.to_dict())
    for name, alias in _HF_ATTRIBUTE_MAP.items():
        if conf.get(name) is None and conf.get(alias) is not None:
            conf[name] = conf[alias]
    return conf


@dataclass(frozen=True)
class RopeConfig:
    """Everything that determines how a model rotates K; two models may share KV only with equal fingerprints.

    ``scaling`` is None for plain RoPE, otherwise sorted ``(key, value)`` pairs that include ``("rope_type", ...)``.
    ``attention_factor`` is the mscale the model folds into cos/sin (already inside cached K; never re-applied).
    """

    head_dim: int
    rotary_dim: int
    base: float
    style: RopeStyle = "neox"
    scaling: ScalingParams | None = None
    attention_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.head_dim <= 0 or self.rotary_dim <= 0 or self.rotary_dim > self.head_dim or self.rotary_dim % 2:
            raise UnsupportedRope(
                f"rotary_dim must be even and in (0, head_dim]: rotary_dim={self.rotary_dim}, head_dim={self.head_dim}"
            )
        if not (math.isfinite(self.base) and self.base > 1.0):
            raise UnsupportedRope(f"rope base (rope_theta) must be a finite number > 1, got {self.base}")
        if self.style not in ("neox", "gptj"):
            raise UnsupportedRope(f"rope style must be 'neox' or 'gptj', got {self.style!r}")
        if self.rope_type not in _SUPPORTED_ROPE_TYPES:
            raise UnsupportedRope(f"rope_type {self.rope_type!r} is not supported")

    @property
    def rope_type(self) -> str:
        return str(self._params().get("rope_type", "default"))

    def _params(self) -> dict[str, Any]:
        return dict(self.scaling or ())

    @classmethod
    def from_hf_config(
        cls,
        cfg: Mapping[str, Any] | Any,
        *,
        style: RopeStyle | None = None,
        max_position: int | None = None,
    ) -> RopeConfig:
        """Build from a Hugging Face config (a ``config.json`` mapping or a ``PretrainedConfig``).

        ``style`` overrides the pairing inferred from ``model_type``. ``max_position`` is the largest position the
        caller will ever rotate to or from; LongRoPE is accepted only when it stays within the short-factor regime.
        Raises `UnsupportedRope` for anything a single delta rotation cannot reproduce exactly.
        """
        conf = hf_config_dict(cfg)
        raw = conf.get("rope_parameters") or conf.get("rope_scaling") or {}
        if not isinstance(raw, Mapping):
            raise UnsupportedRope(f"rope parameters must be a mapping, got {type(raw).__name__}")
        if raw and all(isinstance(v, Mapping) for v in raw.values()):
            raise UnsupportedRope(f"per-layer-type RoPE ({sorted(raw)}) needs one correction per layer type")
        params = dict(raw)
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        if "dynamic" in rope_type:
            raise UnsupportedRope("dynamic NTK RoPE: the base depends on the sequence length, so no single delta")
        if rope_type not in _SUPPORTED_ROPE_TYPES:
            raise UnsupportedRope(f"rope_type {rope_type!r} is not supported")
        if params.get("mrope_section") or conf.get("mrope_section"):
            raise UnsupportedRope("mRoPE (multimodal sections) is not supported")
        if conf.get("no_rope_layers") or conf.get("nope_layer_interval"):
            raise UnsupportedRope("the model has layers without RoPE; correcting every layer would corrupt them")

        head_dim = conf.get("head_dim")
        if not head_dim:
            hidden, heads = conf.get("hidden_size"), conf.get("num_attention_heads")
            if not hidden or not heads:
                raise UnsupportedRope("config names neither head_dim nor hidden_size and num_attention_heads")
            head_dim = int(hidden) // int(heads)
        head_dim = int(head_dim)
        if conf.get("rotary_dim"):
            rotary_dim = int(conf["rotary_dim"])
        else:
            factor = params.get("partial_rotary_factor", conf.get("partial_rotary_factor", conf.get("rotary_pct", 1.0)))
            rotary_dim = int(head_dim * float(factor))
        base = float(
            params.get("rope_theta") or conf.get("rope_theta") or conf.get("rotary_emb_base") or _HF_DEFAULT_THETA
        )
        if conf.get("model_type") in _FIXED_BASE_MODEL_TYPES:
            base = _HF_DEFAULT_THETA
        if style is None:
            style = "gptj" if conf.get("model_type") in _INTERLEAVED_MODEL_TYPES else "neox"

        scaling, attention_factor = _normalize_scaling(rope_type, params, conf, max_position)
        return cls(head_dim, rotary_dim, base, style, scaling, attention_factor)

    def inv_freq(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The model's own (scaled) inverse frequencies: fp32 ``[rotary_dim // 2]``, computed in fp64 then rounded."""
        dim = self.rotary_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        inv = 1.0 / (self.base**exponents)
        p = self._params()
        if self.rope_type == "linear":
            inv = inv / float(p["factor"])
        elif self.rope_type == "llama3":
            inv = _llama3_inv_freq(inv, p)
        elif self.rope_type == "yarn":
            inv = _yarn_inv_freq(inv, self.base, dim, p)
        elif self.rope_type == "longrope":
            inv = inv / torch.tensor(p["short_factor"], dtype=torch.float64)
        return inv.to(torch.float32).to(device)

    def fingerprint(self) -> str:
        """A stable hex digest of everything that changes rotated K (not the informational attention factor)."""
        canonical = json.dumps(
            {
                "head_dim": self.head_dim,
                "rotary_dim": self.rotary_dim,
                "base": repr(float(self.base)),
                "style": self.style,
                "scaling": [[k, v] for k, v in (self.scaling or ())],
            },
            sort_keys=True,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _normalize_scaling(
    rope_type: str, params: dict[str, Any], conf: Mapping[str, Any], max_position: int | None
) -> tuple[ScalingParams | None, float]:
    """Pick the parameters of ``rope_type`` that shape inv_freq, with transformers' defaults filled in."""
    if rope_type == "default":
        return None, 1.0

    def required(key: str) -> Any:
        if params.get(key) is None:
            raise UnsupportedRope(f"{rope_type} RoPE scaling needs {key!r}")
        return params[key]

    original_max = conf.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    original_max = original_max or conf.get("max_position_embeddings")
    attention_factor = 1.0
    if rope_type == "linear":
        kept: dict[str, Any] = {"factor": float(required("factor"))}
    elif rope_type == "llama3":
        kept = {
            "factor": float(required("factor")),
            "low_freq_factor": float(required("low_freq_factor")),
            "high_freq_factor": float(required("high_freq_factor")),
            "original_max_position_embeddings": int(required("original_max_position_embeddings")),
        }
    elif rope_type == "yarn":
        if not original_max:
            raise UnsupportedRope("yarn RoPE scaling needs 'original_max_position_embeddings'")
        factor = params.get("factor") or float(conf["max_position_embeddings"]) / float(original_max)
        kept = {
            "factor": float(factor),
            "original_max_position_embeddings": int(original_max),
            "beta_fast": float(params.get("beta_fast") or 32.0),
            "beta_slow": float(params.get("beta_slow") or 1.0),
            "truncate": bool(params.get("truncate", True)),
        }
        attention_factor = _yarn_attention_factor(float(factor), params)
    else:  # longrope
        if not original_max:
            raise UnsupportedRope("longrope needs 'original_max_position_embeddings'")
        if max_position is None or max_position > int(original_max):
            raise UnsupportedRope(
                f"LongRoPE switches from short to long factors past {original_max} positions; "
                f"rotation is exact only below it (max_position={max_position})"
            )
        kept = {
            "short_factor": tuple(float(x) for x in required("short_factor")),
            "original_max_position_embeddings": int(original_max),
        }
        factor = params.get("factor") or float(conf.get("max_position_embeddings") or original_max) / float(
            original_max
        )
        attention_factor = float(
            params.get("attention_factor")
            or (1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(float(original_max))))
        )
    kept["rope_type"] = rope_type
    return tuple(sorted(kept.items())), attention_factor


def _llama3_inv_freq(inv: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_context = p["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(inv: torch.Tensor, base: float, dim: int, p: dict[str, Any]) -> torch.Tensor:
    factor, original_max = p["factor"], p["original_max_position_embeddings"]

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(p["beta_fast"]), correction_dim(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    return (inv / factor) * (1 - extrapolation_weight) + inv * extrapolation_weight


def _yarn_attention_factor(factor: float, params: dict[str, Any]) -> float:
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return mscale(factor, float(m)) / mscale(factor, float(m_all))
    return mscale(factor)
