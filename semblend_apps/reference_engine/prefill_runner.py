"""Prefill over a preallocated KV arena, eagerly or by replaying a CUDA graph captured per shape.

A paged engine attends over the KV it already holds and writes each new token's K/V once, in place; it never
re-concatenates the prefix per layer, which is what a ``transformers`` ``DynamicCache`` does on every prefill after a
past. :class:`KVArena` gives the model that behaviour: one preallocated ``[num_layers, 2, kv_heads, capacity,
head_dim]`` tensor per request, the prefix gathered into its front, new K/V written after it, and attention reading
views of it (``_ArenaLayer``).

:class:`PrefillRunner` runs the model's forward over the arena. With ``cuda_graphs=True`` it captures one CUDA graph
per ``(prefix tokens, new tokens, kept logits)`` shape on first use and replays it afterwards, removing the per-op
Python dispatch of the eager model (on the H200, Llama-3-8B shape: 128 tokens after a 1920-token past 28.4 -> 9.7 ms,
416 tokens after 7776 29.0 -> 25.2 ms; a long cold prefill is GPU-bound either way). This plays the role of
TensorRT-LLM's prefill CUDA graphs (``prefill_cuda_graph_backend: piecewise`` with ``prefill_capture_num_tokens``,
which capture everything but attention per token count); here attention is captured too, so a graph serves exactly
one prefix length. Cold and materialized prefills go through the same runner, so both sides of a comparison get it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from semblend_apps.reference_engine.hf_model import KVGeometry


@functools.cache
def _arena_layer_class() -> type:
    """``_ArenaLayer`` is defined lazily so that importing this module does not import ``transformers``."""
    from transformers.cache_utils import DynamicLayer

    class _ArenaLayer(DynamicLayer):  # type: ignore[misc,valid-type]
        """One layer's K/V inside a :class:`KVArena`: ``update`` writes in place and returns views, never copies."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
            super().__init__()
            self._k, self._v = keys.unsqueeze(0), values.unsqueeze(0)  # [1, H, capacity, D]
            self.dtype, self.device = keys.dtype, keys.device
            self.filled = filled
            self.is_initialized = True
            self._expose()

        def _expose(self) -> None:
            self.keys, self.values = self._k[:, :, : self.filled], self._v[:, :, : self.filled]

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            """Nothing to allocate: the arena already holds the storage."""

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            end = self.filled + key_states.shape[-2]
            if end > self._k.shape[2]:
                raise ValueError(f"{end} tokens do not fit a KV arena of capacity {self._k.shape[2]}")
            self._k[:, :, self.filled : end].copy_(key_states)
            self._v[:, :, self.filled : end].copy_(value_states)
            self.filled = end
            self._expose()
            assert self.keys is not None and self.values is not None
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.filled

    return _ArenaLayer


class KVArena:
    """Preallocated K/V of one request, ``kv[layer, 0 = K | 1 = V, kv_head, token, dim]``, in the model's dtype.

    ``capacity`` is rounded up to ``align`` tokens so that whole pool blocks can be gathered into it (tokens past
    what a prefill wrote are never read).
    """

    def __init__(
        self, geometry: KVGeometry, capacity: int, dtype: torch.dtype, device: torch.device, *, align: int = 64
    ) -> None:
        capacity = -(-max(capacity, 1) // align) * align
        self.geometry = geometry
        self.kv = torch.empty(
            geometry.num_layers, 2, geometry.kv_heads, capacity, geometry.head_dim, dtype=dtype, device=device
        )

    @property
    def capacity(self) -> int:
        return int(self.kv.shape[3])

    def cache(self, filled: int) -> Any:
        """A ``transformers`` cache over the arena whose first ``filled`` tokens are the past."""
        from transformers.cache_utils import Cache

        layer_cls = _arena_layer_class()
        return Cache(layers=[layer_cls(self.kv[i, 0], self.kv[i, 1], filled) for i in range(self.geometry.num_layers)])


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    logits: torch.Tensor


class PrefillRunner:
    """Runs prefills of one model over a :class:`KVArena`; see the module docstring.

    Call :meth:`reserve` with the request's length, fill ``arena.kv[..., :start, :]`` with the prefix (or leave
    ``start = 0``), then :meth:`prefill`. The arena (and so any cache handed out over it) is reused by the next request.
    """

    def __init__(self, model: Any, *, cuda_graphs: bool = False, capacity: int = 0) -> None:
        param = next(model.parameters())
        if cuda_graphs and not param.is_cuda:
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.model = model
        self.cuda_graphs = cuda_graphs
        self.geometry = KVGeometry.of(model.config)
        self._dtype, self._device = param.dtype, param.device
        self.arena = KVArena(self.geometry, capacity, self._dtype, self._device)
        self._graphs: dict[tuple[int, int, int], _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self.captures = 0
        """CUDA graphs captured so far (a capture inside a timed region would inflate it; benchmarks report this)."""

    def reserve(self, num_tokens: int) -> KVArena:
        """Make the arena hold ``num_tokens``, keeping its contents; growing it drops the captured graphs (they
        point at the old one)."""
        if num_tokens > self.arena.capacity:
            self._graphs.clear()
            if self.cuda_graphs:  # the old pool goes with its graphs; capturing into it again is not allowed
                self._pool = torch.cuda.graph_pool_handle()
            old = self.arena.kv
            self.arena = KVArena(self.geometry, num_tokens, self._dtype, self._device)
            self.arena.kv[:, :, :, : old.shape[3]].copy_(old)
        return self.arena

    @torch.no_grad()  # not inference_mode: the arena it may allocate is written in place outside it (readback)
    def prefill(self, tokens: Sequence[int], start: int, keep: int = 1) -> torch.Tensor:
        """Run ``tokens[start:]`` after the arena's first ``start`` tokens; fp32 logits of the last ``keep`` positions.

        Afterwards the arena holds the K/V of all of ``tokens``.
        """
        self.reserve(len(tokens))
        ids = torch.tensor(list(tokens[start:]), dtype=torch.long, device=self._device)
        if not self.cuda_graphs:
            return self._forward(ids, start, keep).float()
        key = (start, len(ids), keep)
        captured = self._graphs.get(key) or self._capture(key)
        captured.ids.copy_(ids)
        captured.graph.replay()
        return captured.logits.float()

    def _forward(self, ids: torch.Tensor, start: int, keep: int) -> torch.Tensor:
        out = self.model(
            input_ids=ids[None], past_key_values=self.arena.cache(start), use_cache=True, logits_to_keep=keep
        )
        return out.logits[0]

    def _capture(self, key: tuple[int, int, int]) -> _Captured:
        start, n, keep = key
        ids = torch.zeros(n, dtype=torch.long, device=self._device)
        side = torch.cuda.Stream(self._device)
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):  # warm-up outside the capture: cuBLAS handles, workspaces, autotuning
            for _ in range(2):
                self._forward(ids, start, keep)
        torch.cuda.current_stream(self._device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._forward(ids, start, keep)
        self._graphs[key] = captured = _Captured(graph, ids, logits)
        self.captures += 1
        return captured
