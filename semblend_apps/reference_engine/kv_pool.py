"""Moving a request's KV between a Hugging Face cache and a paged pool in TensorRT-LLM's layout.

TensorRT-LLM's PyTorch backend keeps one tensor ``[num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim]``,
head-major inside a block (a view ``[NB, NL, 2, H, T, D]``), with K stored after RoPE and V position-free
(docs/architecture.md). These functions move whole token ranges of one request in one gather/scatter each, between that
layout and a request-contiguous ``[num_layers, 2, kv_heads, seq, head_dim]`` tensor (the reference engine's
:class:`~semblend_apps.reference_engine.prefill_runner.KVArena`).

TensorRT-LLM attends directly on the paged pool; the Hugging Face model needs the prefix gathered into a contiguous
arena (:func:`read_prefix`), which is a cost of this reference engine, not of TensorRT-LLM.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from semblend_kernels.layout import PagedKVLayout


def _view6(pool: torch.Tensor, layout: PagedKVLayout) -> torch.Tensor:
    if layout.order != "head_major":
        raise ValueError("the reference engine writes TensorRT-LLM's default head-major blocks only")
    return pool.view(pool.shape[0], layout.num_layers, 2, layout.num_kv_heads, layout.tokens_per_block, layout.head_dim)


def write_range(
    pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], kv: torch.Tensor, *, start_token: int
) -> None:
    """Scatter ``kv`` (``[NL, 2, H, seq, D]``: tokens ``[start_token, start_token + seq)`` of a request) into its blocks.

    ``block_ids`` are the request's blocks from token 0; ``start_token`` must be block aligned. One scatter for all
    layers.
    """
    tpb = layout.tokens_per_block
    if start_token % tpb:
        raise ValueError(f"start_token {start_token} is not a multiple of tokens_per_block {tpb}")
    seq = kv.shape[3]
    if seq == 0:
        return
    first, nblk = start_token // tpb, -(-seq // tpb)
    if len(block_ids) < first + nblk:
        raise ValueError(f"{seq} tokens from token {start_token} need {first + nblk} blocks, got {len(block_ids)}")
    if nblk * tpb > seq:
        kv = torch.nn.functional.pad(kv, (0, 0, 0, nblk * tpb - seq))
    blocks = kv.reshape(layout.num_layers, 2, layout.num_kv_heads, nblk, tpb, layout.head_dim).permute(3, 0, 1, 2, 4, 5)
    index = torch.tensor(list(block_ids[first : first + nblk]), device=pool.device)
    _view6(pool, layout).index_copy_(0, index, blocks.to(pool.dtype))


def _runs(ids: Sequence[int]) -> list[tuple[int, int]]:
    """``ids`` as maximal runs of consecutive block ids: (first id, length) pairs."""
    runs: list[tuple[int, int]] = []
    for block in ids:
        if runs and runs[-1][0] + runs[-1][1] == block:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block, 1))
    return runs


MAX_RUN_COPIES = 8
"""Up to this many runs of consecutive blocks are copied run by run (no gather); more are gathered first."""


def read_prefix(
    pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], num_tokens: int, out: torch.Tensor
) -> torch.Tensor:
    """Gather a request's first ``num_tokens`` into ``out`` (``[NL, 2, H, capacity, D]``); the filled view of ``out``.

    Whole blocks are copied, so ``capacity`` must reach the end of the last block; tokens past ``num_tokens`` in it
    are left as whatever the block held. Runs of consecutive block ids (what a fresh pool hands out) are copied
    straight from the pool; a fragmented block list is gathered first (one more copy).
    """
    tpb = layout.tokens_per_block
    nblk = -(-num_tokens // tpb)
    if out.shape[3] < nblk * tpb:
        raise ValueError(f"{nblk} blocks of {tpb} tokens do not fit an output of {out.shape[3]} tokens")
    pool6 = _view6(pool, layout)
    dest = out[:, :, :, : nblk * tpb].unflatten(3, (nblk, tpb))  # [NL, 2, H, nblk, T, D]
    runs = _runs(block_ids[:nblk])
    if len(runs) <= MAX_RUN_COPIES:
        done = 0
        for first, length in runs:
            dest[:, :, :, done : done + length].copy_(pool6[first : first + length].permute(1, 2, 3, 0, 4, 5))
            done += length
    else:
        index = torch.tensor(list(block_ids[:nblk]), device=pool.device)
        dest.copy_(pool6.index_select(0, index).permute(1, 2, 3, 0, 4, 5))
    return out[:, :, :, :num_tokens]
