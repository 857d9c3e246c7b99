"""Paged KV pool layouts, viewed by strides (never copied).

TensorRT-LLM hands a connector one pool tensor ``[num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim]``
(index 0 of dim 2 is K, 1 is V). Its default attention backend stores each block head-major (HND):
``[kv_heads, tokens_per_block, head_dim]``; FlashInfer-style backends store it token-major (NHD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LayoutOrder = Literal["head_major", "token_major"]
SUPPORTED_KV_DTYPES = (torch.float16, torch.bfloat16)


class UnsupportedLayout(ValueError):
    """The KV pool's shape, strides or order do not match what the kernels handle."""


class UnsupportedKVDtype(UnsupportedLayout):
    """The KV pool's dtype is not fp16 or bf16 (fp8 KV needs per-layer scales, which these kernels do not take)."""


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

    def check_pool(self, pool: torch.Tensor) -> None:
        """Raise `UnsupportedLayout` / `UnsupportedKVDtype` unless ``pool`` is a pool of this layout."""
        if pool.dtype not in SUPPORTED_KV_DTYPES:
            raise UnsupportedKVDtype(f"KV dtype {pool.dtype} is not supported (fp16 and bf16 are)")
        expected = (self.num_layers, 2, self.block_elems)
        if pool.dim() != 4 or tuple(pool.shape[1:]) != expected:
            raise UnsupportedLayout(f"pool shape {tuple(pool.shape)} is not [num_blocks, *{expected}] for {self}")
        if pool.stride(3) != 1:
            raise UnsupportedLayout("the pool's innermost dimension must be contiguous")

    def view(self, pool: torch.Tensor) -> torch.Tensor:
        """``[NB, NL, 2, H, T, D]`` (head_major) or ``[NB, NL, 2, T, H, D]`` (token_major); a view, no copy."""
        self.check_pool(pool)
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
