"""PyExecutor harness: drives a connector through TensorRT-LLM's documented call order without TensorRT-LLM.

TensorRT-LLM cannot be installed without its GPU wheels, so tests, the replay command and benchmarks use this
harness. It reproduces one PyExecutor iteration (TensorRT-LLM's documented connector call order) per step:

1. allocation: device prefix match (optional block reuse) -> ``get_num_new_matched_tokens`` -> block allocation ->
   ``update_state_after_alloc`` -> ``SchedulerOutput``;
2. ``build_connector_meta`` -> pickle round trip (TensorRT-LLM's ``mpi_broadcast``) -> ``bind_connector_meta`` ->
   ``start_load_kv(stream)``;
3. the forward pass: per layer ``wait_for_layer_load`` / ``save_kv_layer`` around the "model" writing K and V for
   the tokens still to compute, then ``wait_for_save``;
4. ``request_finished`` for finished requests, then ``get_finished`` (blocks of pinned requests are released only
   when the worker reports them, and the harness checks that every reported id was passed in first).

The KV pool is a real tensor in TensorRT-LLM's layout ``[num_blocks, num_layers, 2, tokens_per_block*heads*dim]``.
The "model" is pluggable (:class:`KvWriter`). The default :class:`ContextDependentStandInModel` makes each token's K/V
depend on the KV before it in the pool, like attention does, so shifted KV is approximate and KV computed on top of it
is too; :meth:`PyExecutorHarness.fresh_kv` is a cold prefill to compare with. :class:`ContextFreeStandInModel` makes
K/V a function of (token, position) only, for the tests that need bit-exact shifts (the kernel's oracle).

The engine side is modelled as far as the connector's safety depends on it: block reuse on or off
(``kv_cache_config.enable_block_reuse`` in the LLM args the connector reads), a prefix cache keyed by the cache salt
(finished requests' full blocks, connector-written ones included, become matchable under their salt, like
TensorRT-LLM's radix tree), and the request shapes of TensorRT-LLM 1.2 and 1.3+ (:data:`SALT_SHAPES`).

``api`` selects the connector API generation the harness speaks (``"1.2"`` or ``"1.3"``, the default): its
``RequestData`` / ``SchedulerOutput`` stand-ins (:data:`trtllm_connector.base.STAND_INS`); with ``"1.3"`` every
``RequestData`` carries ``cache_salt`` and ``block_hashes`` (a chain from :func:`stand_in_block_hashes`, standing in
for the engine's C++ block hasher), and ``run_request`` can replay the 1.3+ hooks ``cancel_load`` and
``request_reset`` the way KV cache manager V2 calls them.

Pools may be fp8 (``dtype=torch.float8_e4m3fn`` with ``kv_scale``): the model quantizes K and V with the per-layer
scale as TensorRT-LLM does (``stored = real / scale``, saturating round to nearest even).

Limits: one request per iteration, no chunked prefill, no tensor parallelism, no CUDA graphs, no async loads.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import xxhash
from semblend_kernels.layout import PagedKVLayout
from semblend_kernels.rope import RopeConfig
from semblend_kernels.rope_delta import rotate_reference

from semblend_dynamo.audit import AuditWriter
from semblend_dynamo.config import SemblendConfig, parse_kv_scale

from .base import STAND_INS
from .connector import SemBlendConnectorScheduler, SemBlendConnectorWorker
from .hints import HintInbox


class HarnessViolation(AssertionError):
    """The connector broke a rule TensorRT-LLM enforces (or relies on)."""


class KvWriter(Protocol):
    """The harness's model: writes post-RoPE K and V for a request's tokens into its blocks.

    ``write_kv`` is called once per prefill with the request's ``block_ids`` (token ``i`` lives in block
    ``block_ids[i // tokens_per_block]`` at offset ``i % tokens_per_block``) and must write positions
    ``start_pos .. len(tokens) - 1`` for every layer; positions before ``start_pos`` are already in the pool
    (device prefix or connector) and may be read as context.
    """

    def write_kv(
        self, pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], tokens: Sequence[int], start_pos: int
    ) -> None: ...


class ContextFreeStandInModel:
    """A context-free stand-in model: K = R(position) k(token, layer, head), V = v(token, layer, head).

    ``k`` and ``v`` come from seeded random tables. K/V never depend on other tokens, so a donor's K rotated by the
    position delta equals the fresh K up to rounding: the exact oracle for the connector's copies. It makes shifted
    KV look exact, so it is only for tests of the copy itself; everything else uses
    :class:`ContextDependentStandInModel`.
    """

    def __init__(
        self,
        layout: PagedKVLayout,
        inv_freq: torch.Tensor,
        *,
        rotary_dim: int,
        style: str = "neox",
        vocab: int = 4096,
        seed: int = 0,
    ) -> None:
        self.layout = layout
        self.inv_freq = inv_freq.to(torch.float32)
        self.rotary_dim = rotary_dim
        self.style = style
        self.vocab = vocab
        self.kv_scale: torch.Tensor | None = None
        """fp8 pools: the per-layer dequantization scale ``[num_layers]`` the model quantizes with."""
        gen = torch.Generator().manual_seed(seed)
        shape = (vocab, layout.num_layers, layout.num_kv_heads, layout.head_dim)
        self._k = torch.randn(shape, generator=gen)
        self._v = torch.randn(shape, generator=gen)

    def kv_fp32(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Exact K/V ``[T, NL, 2, H, D]`` in fp32 for ``tokens`` at ``positions``."""
        ids = torch.tensor(list(tokens), dtype=torch.int64) % self.vocab
        pos = torch.tensor(list(positions), dtype=torch.int64)
        k = rotate_reference(self._k[ids], pos, self.inv_freq, self.rotary_dim, self.style)
        return torch.stack([k, self._v[ids]], dim=2)

    def write_kv(
        self, pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], tokens: Sequence[int], start_pos: int
    ) -> None:
        if start_pos >= len(tokens):
            return
        positions = list(range(start_pos, len(tokens)))
        kv = self.kv_fp32([tokens[p] for p in positions], positions)
        scatter_tokens(pool, layout, block_ids, positions, kv, kv_scale=self.kv_scale)


class ContextDependentStandInModel(ContextFreeStandInModel):
    """A stand-in model whose K/V depend on every token before them, through the KV already in the pool.

    ``v_i = OWN * v(tok_i) + MIX * v_{i-1}`` and ``K_i = R(i) (k(tok_i) + MIX * v_{i-1})``, where ``v_{i-1}`` is read
    back from the pool as stored (rounded to its dtype), the way attention reads cached KV. So a continuation computed
    on loaded KV equals a fresh prefill exactly when the loaded KV does, a shifted span differs from a fresh prefill
    (its first tokens followed other context), and anything computed on top of approximate KV is approximate too.
    """

    OWN = 0.45
    MIX = 0.9

    def write_kv(
        self, pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], tokens: Sequence[int], start_pos: int
    ) -> None:
        if start_pos >= len(tokens):
            return
        positions = list(range(start_pos, len(tokens)))
        ids = torch.tensor([tokens[p] for p in positions], dtype=torch.int64) % self.vocab
        scale = torch.ones(layout.num_layers) if self.kv_scale is None else self.kv_scale.float().cpu()
        scale = scale.expand(layout.num_layers).reshape(-1, 1, 1)
        if start_pos:
            prev = gather_tokens(pool, layout, block_ids, [start_pos - 1])[0, :, 1].float().cpu() * scale
        else:
            prev = torch.zeros(self._v.shape[1:])
        own_v = self.OWN * self._v[ids]
        k_content = torch.empty_like(own_v)
        v_out = torch.empty_like(own_v)
        for i in range(len(positions)):
            k_content[i] = self._k[ids[i]] + self.MIX * prev
            prev = ((own_v[i] + self.MIX * prev) / scale).to(pool.dtype).float() * scale  # as the pool will hold it
            v_out[i] = prev
        pos = torch.tensor(positions, dtype=torch.int64)
        k = rotate_reference(k_content, pos, self.inv_freq, self.rotary_dim, self.style)
        scatter_tokens(pool, layout, block_ids, positions, torch.stack([k, v_out], dim=2), kv_scale=self.kv_scale)


def gather_tokens(
    pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], positions: Sequence[int]
) -> torch.Tensor:
    """K/V ``[T, NL, 2, H, D]`` of the given token positions of a request (a copy)."""
    tpb = layout.tokens_per_block
    blocks = torch.tensor([block_ids[p // tpb] for p in positions], dtype=torch.int64)
    offsets = torch.tensor([p % tpb for p in positions], dtype=torch.int64)
    return layout.token_view(pool)[blocks.to(pool.device), offsets.to(pool.device)].clone()


def scatter_tokens(
    pool: torch.Tensor,
    layout: PagedKVLayout,
    block_ids: Sequence[int],
    positions: Sequence[int],
    kv: torch.Tensor,
    *,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Write K/V ``[T, NL, 2, H, D]`` to the given token positions of a request (``kv_scale``: quantize by it)."""
    if kv_scale is not None:
        kv = kv.float() / kv_scale.float().cpu().expand(layout.num_layers).reshape(1, -1, 1, 1, 1)
    tpb = layout.tokens_per_block
    blocks = torch.tensor([block_ids[p // tpb] for p in positions], dtype=torch.int64)
    offsets = torch.tensor([p % tpb for p in positions], dtype=torch.int64)
    layout.token_view(pool)[blocks.to(pool.device), offsets.to(pool.device)] = kv.to(
        device=pool.device, dtype=pool.dtype
    )


SALT_SHAPES = ("cache_salt", "py_cache_salt", "cache_salt_id", "request_data", "none")
"""How a request carries its salt: a 1.2 string attribute, the integer id only (the C++ ``cache_salt_id``), the id on
the request plus the string in 1.3+ ``RequestData.cache_salt``, or no salt field at all (tenant unknown)."""


def stand_in_block_hashes(
    tokens: Sequence[int], tokens_per_block: int, cache_salt: str | None, lora: Any = None, extra_key: str = ""
) -> list[int]:
    """A stand-in for the engine's block hash chain (1.3+ ``RequestData.block_hashes``), one per full block.

    Like TensorRT-LLM's ``BlockKeyHasher``: each hash chains the parent's with the block's tokens; the salt, the LoRA
    task and any extra key (standing in for multimodal keys) are mixed into the first block. The values are opaque:
    the connector only compares them.
    """
    out: list[int] = []
    parent = xxhash.xxh3_64_intdigest(f"{cache_salt}|{lora}|{extra_key}".encode())
    raw, width = array("q", tokens).tobytes(), 8 * tokens_per_block
    for i in range(len(tokens) // tokens_per_block):
        parent = xxhash.xxh3_64_intdigest(raw[i * width : (i + 1) * width], seed=parent)
        out.append(parent)
    return out


def salt_id(cache_salt: str) -> int:
    """A stable 64-bit id for a salt string (TensorRT-LLM hashes it the same way in spirit: an opaque integer)."""
    return int.from_bytes(hashlib.blake2b(cache_salt.encode(), digest_size=8).digest(), "little")


TOKENS_FROM = ("list", "vector", "view")


class HarnessRequest:
    """The part of ``LlmRequest`` the connector reads (bound attributes only).

    ``tokens_from``: how ``get_tokens`` hands the tokens over. ``"list"`` copies a Python list of the tokens.
    ``"vector"`` holds them as TensorRT-LLM does, an int32 vector, and builds a new list of new ints on every read, as
    its binding does (a C++ vector returned to Python is converted element by element): the engine's cost of each
    read. ``"view"`` holds the same vector and returns a read-only numpy int32 view of it (no copy): what a binding
    that exposed the vector as a buffer would return; TensorRT-LLM has no such read today. A view handed out keeps
    the tokens it was given: appending grows a copy.
    """

    def __init__(
        self,
        request_id: int,
        prompt: Sequence[int],
        cache_salt: str | None = None,
        salt_shape: str = "cache_salt",
        tokens_from: str = "list",
    ) -> None:
        if salt_shape not in SALT_SHAPES:
            raise ValueError(f"salt_shape {salt_shape!r}: one of {SALT_SHAPES}")
        if tokens_from not in TOKENS_FROM:
            raise ValueError(f"tokens_from {tokens_from!r}: one of {TOKENS_FROM}")
        self.request_id = request_id
        self.prompt_len = len(prompt)
        if salt_shape in ("cache_salt", "py_cache_salt"):
            setattr(self, salt_shape, cache_salt)
        elif salt_shape in ("cache_salt_id", "request_data"):
            self.cache_salt_id = None if cache_salt is None else salt_id(cache_salt)
        self.salt_shape = salt_shape
        self.cache_salt_string = cache_salt
        self.lora_task_id: int | None = None
        self.tokens_from = tokens_from
        self._tokens: list[int] | array[int] = list(prompt) if tokens_from == "list" else array("i", prompt)
        self.context_current_position = 0

    def get_tokens(self, beam: int) -> list[int] | np.ndarray:
        tokens = self._tokens
        if isinstance(tokens, list):
            return list(tokens)
        if self.tokens_from == "vector":
            return tokens.tolist()
        view = np.frombuffer(tokens, dtype=np.int32)
        view.flags.writeable = False
        return view

    def engine_tokens(self) -> list[int]:
        """The tokens as the engine reads them itself (the harness's engine side; the connector reads ``get_tokens``)."""
        return list(self._tokens)

    def append(self, token: int) -> None:
        if self.tokens_from == "view":  # a view handed out may still be alive: grow a copy, leave the old one to it
            self._tokens = array("i", self._tokens)
        self._tokens.append(token)


@dataclass
class HarnessLlmArgs:
    """The part of ``TorchLlmArgs`` the connector reads."""

    tokens_per_block: int
    model: str | None = None
    attn_backend: str = "TRTLLM"
    tensor_parallel_size: int = 1
    kv_cache_config: Any = None
    enable_block_reuse: bool = True
    """TensorRT-LLM's default; copied into ``kv_cache_config`` where the engine keeps it."""
    kv_dtype: str = "auto"
    """``kv_cache_config.dtype``: ``auto`` or ``fp8``."""

    def __post_init__(self) -> None:
        if self.kv_cache_config is None:
            self.kv_cache_config = HarnessKvCacheConfig(
                self.tokens_per_block, dtype=self.kv_dtype, enable_block_reuse=self.enable_block_reuse
            )


@dataclass
class HarnessKvCacheConfig:
    """The part of ``KvCacheConfig`` the connector reads."""

    tokens_per_block: int
    dtype: str = "auto"
    enable_block_reuse: bool = True
    max_attention_window: list[int] | None = None


class BlockAllocator:
    """Free list with reference counts and, optionally, TensorRT-LLM-style device prefix reuse.

    Freed full blocks stay matchable by their token prefix (and cache salt) until they are handed out again;
    allocation takes the least recently freed block first, like an LRU radix tree evicting a leaf.
    """

    def __init__(self, num_blocks: int, tokens_per_block: int, *, prefix_reuse: bool = False) -> None:
        self.tokens_per_block = tokens_per_block
        self.prefix_reuse = prefix_reuse
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._refs: dict[int, int] = {}
        self._tree: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def match(self, tokens: Sequence[int], salt: Any) -> list[int]:
        """Blocks holding a prefix of ``tokens`` (whole blocks, at least one token left), now referenced."""
        if not self.prefix_reuse:
            return []
        out: list[int] = []
        for key in self._keys(tokens, (len(tokens) - 1) // self.tokens_per_block, salt):
            block = self._tree.get(key)
            if block is None:
                break
            out.append(block)
        for b in out:
            self._take(b)
        return out

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise HarnessViolation(f"out of KV blocks: need {n}, {len(self._free)} free")
        out = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            key = self._key_of.pop(block, None)
            if key is not None:
                del self._tree[key]
            self._refs[block] = 1
            out.append(block)
        return out

    def store_for_reuse(self, blocks: Sequence[int], tokens: Sequence[int], salt: Any) -> None:
        """Make a finished request's full blocks matchable by later requests (with prefix reuse)."""
        if not self.prefix_reuse:
            return
        keys = self._keys(tokens, min(len(blocks), len(tokens) // self.tokens_per_block), salt)
        for block, key in zip(blocks, keys, strict=False):
            if block not in self._key_of and key not in self._tree:
                self._tree[key] = block
                self._key_of[block] = key

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block; unreferenced blocks go back to the free list (still matchable)."""
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                del self._refs[block]
                self._free[block] = None

    def _take(self, block: int) -> None:
        if block in self._free:
            del self._free[block]
            self._refs[block] = 1
        else:
            self._refs[block] += 1

    def _keys(self, tokens: Sequence[int], n: int, salt: Any) -> Iterator[bytes]:
        """Keys of the first ``n`` whole blocks: each hashes the previous key with the block's tokens (linear time)."""
        raw, width = array("q", tokens[: n * self.tokens_per_block]).tobytes(), 8 * self.tokens_per_block
        key = xxhash.xxh3_128_digest(repr(salt or "").encode())
        for i in range(n):
            key = xxhash.xxh3_128_digest(key + raw[i * width : (i + 1) * width])
            yield key


@dataclass
class RequestResult:
    """What happened to one request in the harness."""

    request_id: int
    prompt_tokens: int
    device_matched: int
    promised: int
    block_ids: list[int]
    connector_written_blocks: list[int] | None
    """Fresh blocks whose bytes the connector changed (None when the harness's write detection is off)."""
    kv: torch.Tensor | None = None
    """K/V ``[prompt_tokens, NL, 2, H, D]`` as the request's blocks held them after its prefill."""
    pinned: bool = False
    released_donors: list[int] = field(default_factory=list)
    first_token_at: float = 0.0
    """``time.perf_counter()`` when the prefill finished (device drained): the first token's time."""


class PyExecutorHarness:
    """Runs requests one per iteration through a scheduler/worker pair over a real paged KV pool."""

    def __init__(
        self,
        scheduler: Any,
        worker: Any,
        layout: PagedKVLayout,
        num_blocks: int,
        model: KvWriter,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        prefix_reuse: bool = False,
        api: str = "1.3",
    ) -> None:
        if api not in STAND_INS:
            raise ValueError(f"api {api!r}: one of {sorted(STAND_INS)}")
        self.api = api
        self._request_data = STAND_INS[api].request_data
        self._scheduler_output = STAND_INS[api].scheduler_output
        self.scheduler = scheduler
        self.worker = worker
        self.layout = layout
        self.model = model
        self.pool = torch.zeros(num_blocks, layout.num_layers, 2, layout.block_elems, dtype=dtype, device=device)
        self.allocator = BlockAllocator(num_blocks, layout.tokens_per_block, prefix_reuse=prefix_reuse)
        self.harness_checks = True
        """The harness's own checks, off in timed runs: snapshot fresh blocks around the connector's load to report
        which it wrote, and send the metadata through a pickle round trip as a broadcast to other ranks would."""
        self.stream = torch.cuda.current_stream() if self.pool.is_cuda else None
        self._next_id = 1
        self._pinned: dict[int, list[int]] = {}
        self._passed_in: set[int] = set()
        self.max_pinned_blocks = 0
        worker.register_kv_caches(self.pool)
        scheduler.wait_for_initialization()

    @classmethod
    def with_stand_in(
        cls,
        cfg: SemblendConfig,
        *,
        num_layers: int = 2,
        num_kv_heads: int = 2,
        head_dim: int = 16,
        num_blocks: int = 256,
        rope_theta: float = 10000.0,
        dtype: torch.dtype = torch.bfloat16,
        prefix_reuse: bool = False,
        audit: AuditWriter | None = None,
        hints: HintInbox | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
        device: str | torch.device = "cpu",
        context_free: bool = False,
        llm_args: HarnessLlmArgs | None = None,
        api: str = "1.3",
    ) -> PyExecutorHarness:
        """SemBlend's scheduler and worker over a pool of this geometry, with a stand-in model.

        ``prefix_reuse`` is the engine's block reuse (``enable_block_reuse``, also told to the connector through
        the LLM args). The model is :class:`ContextDependentStandInModel` unless ``context_free`` (bit-exact shifts).
        An fp8 ``dtype`` makes the KV cache fp8 (``kv_cache_config.dtype``); the model then quantizes with
        ``cfg.kv_scale`` (1.0 when unset), as the engine would with the checkpoint's scale.
        Unless ``cfg.rope_config`` is set, a Llama-style model config of this geometry is used. The scheduler gets
        its own hint inbox and (unless given) an in-memory audit writer, so harnesses do not share state.
        """
        hf = {
            "model_type": "llama",
            "num_hidden_layers": num_layers,
            "num_attention_heads": num_kv_heads,
            "num_key_value_heads": num_kv_heads,
            "hidden_size": num_kv_heads * head_dim,
            "head_dim": head_dim,
            "rope_theta": rope_theta,
        }
        if cfg.rope_config is None:
            cfg = cfg.model_copy(update={"rope_config": json.dumps(hf)})
        else:
            hf = json.loads(cfg.rope_config) if cfg.rope_config.strip().startswith("{") else hf
        fp8 = dtype == torch.float8_e4m3fn
        if llm_args is None:
            llm_args = HarnessLlmArgs(
                cfg.block_size, enable_block_reuse=prefix_reuse, kv_dtype="fp8" if fp8 else "auto"
            )
        audit = audit if audit is not None else AuditWriter(None)
        scheduler = SemBlendConnectorScheduler(
            llm_args, config=cfg, audit=audit, hints=hints if hints is not None else HintInbox(), clock=clock
        )
        worker = SemBlendConnectorWorker(llm_args, config=cfg, audit=audit, rank=0)
        layout = PagedKVLayout(num_layers, num_kv_heads, head_dim, cfg.block_size)
        rope = RopeConfig.from_hf_config(hf)
        model_cls = ContextFreeStandInModel if context_free else ContextDependentStandInModel
        model = model_cls(layout, rope.inv_freq(), rotary_dim=rope.rotary_dim, style=rope.style, seed=seed)
        if fp8:
            model.kv_scale = torch.tensor(parse_kv_scale(cfg.kv_scale or "1.0"), dtype=torch.float32)
        return cls(
            scheduler, worker, layout, num_blocks, model, dtype=dtype, device=device, prefix_reuse=prefix_reuse, api=api
        )

    @property
    def pinned_blocks(self) -> int:
        """Blocks the engine keeps for pinned (finished, not yet released) requests."""
        return sum(len(blocks) for blocks in self._pinned.values())

    def run_request(
        self,
        prompt: Sequence[int],
        *,
        cache_salt: str | None = None,
        salt_shape: str = "cache_salt",
        lora_task_id: int | None = None,
        output_tokens: int = 0,
        capture_kv: bool = True,
        cancel_tail: int = 0,
        reset_once: bool = False,
        engine_extra_key: str = "",
        tokens_from: str = "list",
    ) -> RequestResult:
        """One request end to end: a prefill iteration, ``output_tokens`` decode iterations, then finish.

        ``salt_shape`` says how the request carries ``cache_salt`` (:data:`SALT_SHAPES`); the engine's prefix cache
        keys blocks by the salt whatever the shape. API 1.3 only: ``cancel_tail`` tokens at the end of the offer are
        cancelled (``cancel_load``) and computed by the "model" instead; ``reset_once`` releases the first
        allocation (``request_reset``) and runs the request again from the start; ``engine_extra_key`` is mixed into
        the engine's block hashes only (what the connector cannot see, e.g. multimodal content); ``tokens_from``: how
        the request's ``get_tokens`` hands its tokens over (:class:`HarnessRequest`).
        """
        if self.api == "1.2" and (cancel_tail or reset_once or salt_shape == "request_data"):
            raise ValueError("cancel_load, request_reset and RequestData.cache_salt are TensorRT-LLM 1.3+ only")
        request = HarnessRequest(self._next_id, prompt, cache_salt, salt_shape, tokens_from)
        request.lora_task_id = lora_task_id
        self._next_id += 1
        tpb = self.layout.tokens_per_block
        cache_key = (cache_salt or "", lora_task_id)  # TensorRT-LLM's block key mixes in the salt and the LoRA task
        rd_salt = None if salt_shape == "none" else cache_salt
        for attempt in range(2 if reset_once else 1):
            device = self.allocator.match(prompt, cache_key)
            num_computed = len(device) * tpb
            promised, is_async = self.scheduler.get_num_new_matched_tokens(request, num_computed)
            if is_async and promised == 0:
                raise HarnessViolation("load_kv_async must be False when num_tokens is 0!")
            if promised % tpb or promised < 0:
                raise HarnessViolation(f"promised {promised} tokens: not whole blocks")
            if num_computed + promised >= len(prompt):
                raise HarnessViolation("There must be at least one uncomputed token in the prompt!")
            block_ids = device + self.allocator.allocate(-(-len(prompt) // tpb) - len(device))
            self.scheduler.update_state_after_alloc(request, list(block_ids))
            if reset_once and attempt == 0:  # V2 rollback: the allocation dies, the request runs again from the start
                self.scheduler.request_reset(request)
                self.allocator.release(block_ids)
        consumed = promised
        if cancel_tail and promised:
            consumed = max(0, promised - cancel_tail)
            self.scheduler.cancel_load(request, num_computed + consumed, num_computed + promised)
        new_request = self._new_request_data(
            request.request_id,
            new_tokens=list(prompt),
            new_block_ids=list(block_ids),
            computed_position=num_computed,
            num_scheduled_tokens=len(prompt) - num_computed - consumed,
            hashes=(prompt, rd_salt, lora_task_id, engine_extra_key),
        )
        if salt_shape == "request_data" or self.api != "1.2":  # TensorRT-LLM 1.3+: the salt string reaches us here
            new_request.cache_salt = rd_salt  # type: ignore[attr-defined]
        fresh = block_ids[len(device) :]
        # A check TensorRT-LLM does not make: snapshot the fresh blocks to see which ones the connector wrote (two
        # passes over them: timed benchmark runs turn it off with ``harness_checks = False``).
        before = self.pool[fresh].view(torch.uint8).clone() if self.harness_checks else None
        self._start_batch(self._scheduler_output(new_requests=[new_request], cached_requests=[]))
        written: list[int] | None = None
        if before is not None:
            changed = (self.pool[fresh].view(torch.uint8) != before).flatten(1).any(dim=1).tolist()
            written = [b for b, c in zip(fresh, changed, strict=True) if c]
        self._forward(block_ids, request.engine_tokens(), num_computed + consumed)
        if self.pool.is_cuda:  # the first token needs the prefill done: the host waits for it, as the engine does
            torch.cuda.synchronize(self.pool.device)
        first_token_at = time.perf_counter()
        kv = gather_tokens(self.pool, self.layout, block_ids, range(len(prompt))) if capture_kv else None
        for _ in range(output_tokens):
            request.append(request.engine_tokens()[-1] + 1)
            tokens = request.engine_tokens()
            if len(tokens) > len(block_ids) * tpb:
                block_ids += self.allocator.allocate(1)
            cached = self._new_request_data(
                request.request_id,
                new_tokens=tokens[-1:],
                new_block_ids=block_ids[-1:],
                computed_position=len(tokens) - 1,
                num_scheduled_tokens=1,
                hashes=(tokens, rd_salt, lora_task_id, engine_extra_key),
            )
            if self.api != "1.2":
                cached.cache_salt = rd_salt  # type: ignore[attr-defined]
            self._start_batch(self._scheduler_output(new_requests=[], cached_requests=[cached]))
            self._forward(block_ids, tokens, len(tokens) - 1)
        pinned = bool(self.scheduler.request_finished(request, list(block_ids)))
        self.allocator.store_for_reuse(block_ids, request.engine_tokens()[: len(prompt)], cache_key)
        if pinned:  # like store_blocks_for_reuse(pin_on_release=True): matchable, but kept until reported
            self._pinned[request.request_id] = list(block_ids)
            self.max_pinned_blocks = max(self.max_pinned_blocks, self.pinned_blocks)
        else:
            self.allocator.release(block_ids)
        released = self._end_iteration([request.request_id] if pinned else [])
        return RequestResult(
            request_id=request.request_id,
            prompt_tokens=len(prompt),
            device_matched=num_computed,
            promised=consumed,
            block_ids=list(block_ids),
            connector_written_blocks=written,
            kv=kv,
            pinned=pinned,
            released_donors=released,
            first_token_at=first_token_at,
        )

    def _new_request_data(self, request_id: int, *, hashes: tuple[Any, ...], **fields: Any) -> Any:
        """This generation's ``RequestData`` (1.3+: with the block hash chain of the request's tokens so far)."""
        rd = self._request_data(request_id=request_id, **fields)
        if self.api != "1.2":
            tokens, salt, lora, extra = hashes
            rd.block_hashes = stand_in_block_hashes(tokens, self.layout.tokens_per_block, salt, lora, extra)
        return rd

    def idle_iteration(self) -> list[int]:
        """An iteration without requests (the connector still builds metadata and reports releases)."""
        self._start_batch(self._scheduler_output(new_requests=[], cached_requests=[]))
        self.worker.wait_for_save(self.stream)
        self.worker._clear_connector_meta()
        return self._end_iteration([])

    def fresh_kv(self, prompt: Sequence[int]) -> torch.Tensor:
        """K/V ``[T, NL, 2, H, D]`` of a cold prefill of ``prompt``, computed by the model into a scratch pool."""
        tpb = self.layout.tokens_per_block
        blocks = list(range(-(-len(prompt) // tpb)))
        scratch = torch.zeros((len(blocks), *self.pool.shape[1:]), dtype=self.pool.dtype, device=self.pool.device)
        self.model.write_kv(scratch, self.layout, blocks, prompt, 0)
        return gather_tokens(scratch, self.layout, blocks, range(len(prompt)))

    def reallocate(self, block_ids: Sequence[int]) -> None:
        """Fault injection: the engine hands ``block_ids`` (e.g. a pinned donor's) to a new request.

        TensorRT-LLM does not do this to pinned blocks; the harness does it to check that the connector notices
        (generation change) instead of trusting the pin.
        """
        request = HarnessRequest(self._next_id, [0] * (len(block_ids) * self.layout.tokens_per_block))
        self._next_id += 1
        self.scheduler.update_state_after_alloc(request, list(block_ids))

    # --- one iteration's connector calls ---------------------------------------------------------------
    def _start_batch(self, scheduler_output: Any) -> None:
        metadata = self.scheduler.build_connector_meta(scheduler_output)
        if self.harness_checks:  # what a broadcast to other ranks does; one rank binds the object itself
            metadata = pickle.loads(pickle.dumps(metadata))
        self.worker.bind_connector_meta(metadata)
        self.worker.start_load_kv(self.stream)

    def _forward(self, block_ids: Sequence[int], tokens: Sequence[int], start_pos: int) -> None:
        for layer in range(self.layout.num_layers):
            self.worker.wait_for_layer_load(layer, self.stream)
            if layer == 0:  # the model writes every layer at once; the hooks still fire per layer, in order
                self.model.write_kv(self.pool, self.layout, block_ids, tokens, start_pos)
            self.worker.save_kv_layer(layer, self.stream)
        self.worker.wait_for_save(self.stream)
        self.worker._clear_connector_meta()

    def _end_iteration(self, finished_gen_req_ids: list[int]) -> list[int]:
        self._passed_in.update(finished_gen_req_ids)
        saving, loading = self.worker.get_finished(finished_gen_req_ids, [])
        if loading:
            raise HarnessViolation(f"finished_loading {loading} but no async load was started")
        for request_id in saving:
            if request_id not in self._passed_in:
                raise HarnessViolation(f"request {request_id} reported saved before it was passed in")
            self.allocator.release(self._pinned.pop(request_id))
            self._passed_in.discard(request_id)
        self.max_pinned_blocks = max(self.max_pinned_blocks, self.pinned_blocks)
        return list(saving)
