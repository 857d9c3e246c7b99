"""Moving a request's KV between a Hugging Face cache and a paged pool in TensorRT-LLM's layout.

TensorRT-LLM's PyTorch backend keeps one tensor ``[num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim]``,
head-major inside a block (a view ``[NB, NL, 2, H, T, D]``), with K stored after RoPE and V position-free
(DESIGN.md §3.5). These functions move whole token ranges of one request in one gather/scatter each, between that
layout and the per-layer ``[1, kv_heads, seq, head_dim]`` tensors of a ``transformers`` cache.

TensorRT-LLM attends directly on the paged pool; the Hugging Face model needs the prefix gathered back into a
contiguous cache (:func:`read_prefix`), which is a cost of this reference engine, not of TensorRT-LLM.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from semblend_kernels.layout import PagedKVLayout

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's (K, V), each ``[1, kv_heads, seq, head_dim]``."""


def _view6(pool: torch.Tensor, layout: PagedKVLayout) -> torch.Tensor:
    if layout.order != "head_major":
        raise ValueError("the reference engine writes TensorRT-LLM's default head-major blocks only")
    return pool.view(pool.shape[0], layout.num_layers, 2, layout.num_kv_heads, layout.tokens_per_block, layout.head_dim)


def write_range(
    pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], layers: list[LayerKV], *, start_token: int
) -> None:
    """Scatter tokens ``[start_token, start_token + seq)`` of a request into its blocks (all layers at once).

    ``block_ids`` are the request's blocks from token 0; ``start_token`` must be block aligned.
    """
    tpb = layout.tokens_per_block
    if start_token % tpb:
        raise ValueError(f"start_token {start_token} is not a multiple of tokens_per_block {tpb}")
    kv = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers])  # [NL, 2, H, S, D]
    seq = kv.shape[3]
    if seq == 0:
        return
    first, nblk = start_token // tpb, -(-seq // tpb)
    if len(block_ids) < first + nblk:
        raise ValueError(f"{seq} tokens from token {start_token} need {first + nblk} blocks, got {len(block_ids)}")
    if nblk * tpb > seq:
        kv = torch.nn.functional.pad(kv, (0, 0, 0, nblk * tpb - seq))
    kv = kv.view(layout.num_layers, 2, layout.num_kv_heads, nblk, tpb, layout.head_dim).permute(3, 0, 1, 2, 4, 5)
    index = torch.tensor(list(block_ids[first : first + nblk]), device=pool.device)
    _view6(pool, layout).index_copy_(0, index, kv.to(pool.dtype))


def read_prefix(pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], num_tokens: int) -> list[LayerKV]:
    """Gather a request's first ``num_tokens`` as per-layer ``[1, H, num_tokens, D]`` K and V (a copy)."""
    tpb = layout.tokens_per_block
    nblk = -(-num_tokens // tpb)
    index = torch.tensor(list(block_ids[:nblk]), device=pool.device)
    blocks = _view6(pool, layout).index_select(0, index)  # [nblk, NL, 2, H, T, D]
    flat = blocks.permute(1, 2, 3, 0, 4, 5).reshape(
        layout.num_layers, 2, layout.num_kv_heads, nblk * tpb, layout.head_dim
    )[:, :, :, :num_tokens]
    return [(flat[i, 0].unsqueeze(0), flat[i, 1].unsqueeze(0)) for i in range(layout.num_layers)]
