"""A paged KV pool in TensorRT-LLM's layout, filled from and read back into Hugging Face caches.

TensorRT-LLM's PyTorch backend keeps one tensor ``[num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim]``,
head-major inside a block (a view ``[NB, NL, 2, H, T, D]``), with K stored after RoPE and V position-free
(DESIGN.md §3.5). :class:`PagedKVPool` owns such a tensor plus a free list of block ids. It moves whole
requests between that layout and the per-layer ``[batch, kv_heads, seq, head_dim]`` tensors of a
``transformers`` cache in one gather/scatter each.

This is the reference engine's memory, not TensorRT-LLM's: TensorRT-LLM attends directly on the paged pool,
while the Hugging Face model here needs the prefix gathered back into a contiguous cache.
"""

from __future__ import annotations

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's (K, V), each ``[1, kv_heads, seq, head_dim]``."""


class PoolExhausted(RuntimeError):
    """No free blocks are left for a request."""


class PagedKVPool:
    """``[num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim]`` plus a free list."""

    def __init__(
        self,
        *,
        num_blocks: int,
        num_layers: int,
        kv_heads: int,
        head_dim: int,
        tokens_per_block: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.tokens_per_block = tokens_per_block
        self.tensor = torch.zeros(
            (num_blocks, num_layers, 2, tokens_per_block * kv_heads * head_dim), dtype=dtype, device=device
        )
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def view6(self) -> torch.Tensor:
        """The pool as ``[NB, NL, 2, H, T, D]``."""
        nb = self.tensor.shape[0]
        return self.tensor.view(nb, self.num_layers, 2, self.kv_heads, self.tokens_per_block, self.head_dim)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens``."""
        return -(-num_tokens // self.tokens_per_block)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` free block ids (lowest first)."""
        if num_blocks > len(self._free):
            raise PoolExhausted(f"asked for {num_blocks} blocks, {len(self._free)} free")
        return [self._free.pop() for _ in range(num_blocks)]

    def free(self, block_ids: list[int]) -> None:
        """Return block ids to the free list."""
        self._free.extend(sorted(block_ids, reverse=True))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def write(self, block_ids: list[int], layers: list[LayerKV], *, start_token: int = 0) -> None:
        """Scatter tokens ``[start_token, start_token + seq)`` of a request into its blocks.

        Called by the engine after a prefill (the role TensorRT-LLM's attention kernel plays). ``start_token``
        must be block aligned; ``block_ids`` are the request's blocks from token 0.
        """
        if start_token % self.tokens_per_block:
            raise ValueError(f"start_token {start_token} is not a multiple of {self.tokens_per_block}")
        kv = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers])  # [NL, 2, H, S, D]
        seq = kv.shape[3]
        if seq == 0:
            return
        first = start_token // self.tokens_per_block
        nblk = self.blocks_for(seq)
        pad = nblk * self.tokens_per_block - seq
        if pad:
            kv = torch.nn.functional.pad(kv, (0, 0, 0, pad))
        kv = kv.view(self.num_layers, 2, self.kv_heads, nblk, self.tokens_per_block, self.head_dim)
        index = torch.tensor(block_ids[first : first + nblk], device=self.tensor.device)
        if len(index) != nblk:
            raise ValueError(f"{seq} tokens from token {start_token} need {nblk} blocks, got {len(index)}")
        self.view6.index_copy_(0, index, kv.permute(3, 0, 1, 2, 4, 5).to(self.tensor.dtype))

    def read_prefix(self, block_ids: list[int], num_tokens: int) -> list[LayerKV]:
        """Gather a request's first ``num_tokens`` back into per-layer ``[1, H, num_tokens, D]`` K and V."""
        nblk = self.blocks_for(num_tokens)
        index = torch.tensor(block_ids[:nblk], device=self.tensor.device)
        blocks = self.view6.index_select(0, index)  # [nblk, NL, 2, H, T, D]
        flat = blocks.permute(1, 2, 3, 0, 4, 5).reshape(
            self.num_layers, 2, self.kv_heads, nblk * self.tokens_per_block, self.head_dim
        )[:, :, :, :num_tokens]
        return [(flat[layer, 0].unsqueeze(0), flat[layer, 1].unsqueeze(0)) for layer in range(self.num_layers)]
