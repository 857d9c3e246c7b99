"""Paged KV pool layouts, viewed by strides (never copied).

TensorRT-LLM hands a connector one pool tensor ``[num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim]``
(index 0 of dim 2 is K, 1 is V). Its default attention backend stores each block head-major (HND):
``[kv_heads, tokens_per_block, head_dim]``; FlashInfer-style backends store it token-major (NHD).

Storage dtypes: fp16, bf16, fp32, and fp8 e4m3 (``torch.float8_e4m3fn``) with the cache's dequantization scale
(``real = stored * scale``; TensorRT-LLM's ``kv_scale_quant_orig``): fp32, one per layer ``[num_layers]`` or one for
the whole pool ``[1]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LayoutOrder = Literal["head_major", "token_major"]
FP8_KV_DTYPE = torch.float8_e4m3fn
SUPPORTED_KV_DTYPES = (torch.float16, torch.bfloat16, torch.float32, FP8_KV_DTYPE)


class UnsupportedLayout(ValueError):
    """The KV pool's shape, strides or order do not match what the kernels handle."""


class UnsupportedKVDtype(UnsupportedLayout):
    """The KV pool's dtype is not supported, or an fp8 pool comes without a valid scale (or a scale without fp8)."""


@dataclass(frozen=True)
class PagedKVLayout:
    """Geometry of one paged KV pool (the local shard under tensor parallelism)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    tokens_per_block: int
    order: LayoutOrder = "head_major"

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_kv_heads, self.head_dim, self.tokens_per_block) <= 0:
            raise UnsupportedLayout(f"layout sizes must be positive: {self}")
        if self.order not in ("head_major", "token_major"):
            raise UnsupportedLayout(f"order must be 'head_major' or 'token_major', got {self.order!r}")

    @property
    def block_elems(self) -> int:
        """Elements of K (or V) of one layer in one block."""
        return self.tokens_per_block * self.num_kv_heads * self.head_dim

    def check_pool(self, pool: torch.Tensor, kv_scale: torch.Tensor | None = None) -> None:
        """Raise `UnsupportedLayout` / `UnsupportedKVDtype` unless ``pool`` (with ``kv_scale``) is a pool of this layout.

        ``kv_scale`` is required for an fp8 pool and refused for any other.
        """
        if pool.dtype not in SUPPORTED_KV_DTYPES:
            raise UnsupportedKVDtype(
                f"KV dtype {pool.dtype} is not supported (fp16, bf16, fp32 and float8_e4m3fn with a scale are)"
            )
        self._check_scale(pool, kv_scale)
        self._check_geometry(pool)

    def _check_geometry(self, pool: torch.Tensor) -> None:
        expected = (self.num_layers, 2, self.block_elems)
        if pool.dim() != 4 or tuple(pool.shape[1:]) != expected:
            raise UnsupportedLayout(f"pool shape {tuple(pool.shape)} is not [num_blocks, *{expected}] for {self}")
        if pool.stride(3) != 1:
            raise UnsupportedLayout("the pool's innermost dimension must be contiguous")

    def _check_scale(self, pool: torch.Tensor, kv_scale: torch.Tensor | None) -> None:
        if pool.dtype != FP8_KV_DTYPE:
            if kv_scale is not None:
                raise UnsupportedKVDtype(f"kv_scale applies to float8_e4m3fn pools only, not {pool.dtype}")
            return
        if kv_scale is None:
            raise UnsupportedKVDtype(
                "an fp8 (float8_e4m3fn) pool needs its dequantization scale: "
                f"kv_scale=fp32 tensor [{self.num_layers}] (per layer) or [1]"
            )
        if kv_scale.dtype != torch.float32 or kv_scale.dim() != 1 or kv_scale.numel() not in (1, self.num_layers):
            raise UnsupportedKVDtype(
                f"kv_scale must be fp32 [{self.num_layers}] or [1], got {kv_scale.dtype} {tuple(kv_scale.shape)}"
            )
        if kv_scale.device != pool.device:
            raise UnsupportedKVDtype(f"kv_scale is on {kv_scale.device}, the pool on {pool.device}")
        if not kv_scale.is_cuda and not bool((torch.isfinite(kv_scale) & (kv_scale > 0)).all()):  # no device sync
            raise UnsupportedKVDtype("kv_scale must be finite and positive")

    def view(self, pool: torch.Tensor) -> torch.Tensor:
        """``[NB, NL, 2, H, T, D]`` (head_major) or ``[NB, NL, 2, T, H, D]`` (token_major); a view, no copy."""
        self._check_geometry(pool)
        if self.order == "head_major":
            return pool.unflatten(3, (self.num_kv_heads, self.tokens_per_block, self.head_dim))
        return pool.unflatten(3, (self.tokens_per_block, self.num_kv_heads, self.head_dim))

    def token_view(self, pool: torch.Tensor) -> torch.Tensor:
        """``[NB, T, NL, 2, H, D]`` for either order: (block, token) first, for gathers by token slot; no copy."""
        v = self.view(pool)
        if self.order == "head_major":
            return v.permute(0, 4, 1, 2, 3, 5)
        return v.permute(0, 3, 1, 2, 4, 5)

    def kernel_strides(self, pool: torch.Tensor) -> tuple[int, int, int, int, int]:
        """Element strides of (block, layer, K|V, head, token) in ``pool``; head_dim has stride 1."""
        v = self.view(pool)
        if self.order == "head_major":
            return v.stride(0), v.stride(1), v.stride(2), v.stride(3), v.stride(4)
        return v.stride(0), v.stride(1), v.stride(2), v.stride(4), v.stride(3)
