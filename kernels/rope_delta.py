"""RoPE-delta correction on paged KV: Triton kernels, their typed wrappers, and the torch reference (the oracle).

K is cached after RoPE at the donor's positions. Rotary embeddings compose, ``R(p + d) k = R(d) R(p) k``, so K moves to
position ``p + d`` by one rotation of angle ``d * inv_freq``: computed in fp32 from the model's own inv_freq, with unit
cos/sin (any attention factor is already inside cached K). V is position-free and copied unchanged.

Plans are int64 tensors with one row per span; a row never leaves its block (`split_spans_to_plan` splits token spans at
block boundaries; offsets may be unaligned):

- copy: ``(src_block, src_offset, dst_block, dst_offset, n_tokens, delta)``; K and V of tokens
  ``src_offset .. src_offset + n_tokens - 1`` of ``src_block`` go to the same slots of ``dst_block``.
- in place: ``(block, offset, n_tokens, delta)``; K of those tokens is rotated where it lies.

One launch covers every plan row and every layer of ``layers`` (``[start, stop)``, default all). A row with delta 0 is a
pure copy (or nothing, in place).

fp8 (e4m3) pools pass ``kv_scale``, the cache's dequantization scale (``real = stored * scale``), fp32 ``[num_layers]``
or ``[1]``. Rotated K is rotated in fp32 and requantized (round to nearest even, saturating at +-448); the rotation is
linear, so the dequantization and requantization by the layer's scale cancel and the kernels skip them (the references,
the tests' oracle, apply them). V, delta-0 rows and channels past rotary_dim are copied byte for byte.

The Triton kernels run when the pool is on CUDA, or on any device when Triton's interpreter is on
(``TRITON_INTERPRET=1`` at import); otherwise the functions fall back to the torch reference.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from .layout import FP8_KV_DTYPE, PagedKVLayout

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference still works
    triton = None  # type: ignore[assignment]

RopeStyle = Literal["neox", "gptj"]
COPY_PLAN_COLUMNS = 6
INPLACE_PLAN_COLUMNS = 4
# Positions are exact fp32 integers below 2**24; larger deltas cannot be rotated exactly in fp32.
MAX_ABS_DELTA = (1 << 24) - 1
FP8_MAX = 448.0  # the largest finite e4m3fn value
GROUP_COLUMNS = 8
"""A row group: first row, rows, target block, delta; then, for a one-row group, target offset, tokens, source block
and source offset minus target offset (zeros otherwise)."""


class InvalidPlan(ValueError):
    """A plan row points outside the pool, leaves its block, or would race with another row."""


@dataclass(frozen=True)
class CopySpan:
    """``n_tokens`` consecutive tokens from donor token index ``src_start`` to target token index ``dst_start``.

    Token indices count through the request's block list (token i lives in block ``i // T`` at offset ``i % T``).
    ``delta`` is the position shift applied to K; by default the token moves from position src_start to dst_start.
    """

    src_start: int
    dst_start: int
    n_tokens: int
    delta: int | None = None


@dataclass(frozen=True)
class InplaceSpan:
    """``n_tokens`` consecutive tokens from token index ``start`` whose K is rotated by ``delta`` in place."""

    start: int
    n_tokens: int
    delta: int


@dataclass(frozen=True)
class KernelTuning:
    """Launch parameters: warps per program, layers per program, a register cap, heads per program, and four program
    shapes.

    A program takes one row group (the rows of one target block with one delta) times ``layers_per_program`` layers
    times ``heads_per_program`` KV heads (None: all; times K or V for copies), one head tile at a time.
    ``max_registers`` caps registers per thread (Triton's ``maxnreg``; None leaves it to the compiler), which sets how
    many programs share a multiprocessor. ``load_all_tiles``: each program loads every tile it moves (its layers x
    heads, K or V) with one load before it stores any (a program's bytes all in flight at once, cos/sin computed while
    they are). ``layers_fastest``: programs are numbered layer run first, group second, so the programs that run
    together cover neighbouring layers of the same blocks (contiguous memory) rather than the same layer of many blocks
    (issue 16.4, session 10). ``one_trip_start``: a program's first data loads wait for one dependent read (its row
    group's descriptor, every column in one round trip) instead of two or three: in-place programs issue their first
    tile's loads before computing cos/sin; load-all-tiles programs (copy and in place) stop the compiler from reading a
    one-row group's slots only after its row count; the copy grid kernel ignores it (issue 16.4, session 12).
    ``l2_prefetch`` (issue 16.4, session 14; in-place ``one_trip_start`` programs without ``load_all_tiles``, ignored
    by layouts it does not fit, see `_prefetch_step`): the program first asks L2 for every K byte it will rotate, one
    bulk prefetch a layer, so that its head tiles after the first find their lines in L2 (head-major pools).
    """

    num_warps: int = 16
    layers_per_program: int = 2
    max_registers: int | None = 40
    heads_per_program: int | None = None
    load_all_tiles: bool = False
    layers_fastest: bool = False
    one_trip_start: bool = False
    l2_prefetch: bool = False

    def __post_init__(self) -> None:
        optional = (self.max_registers, self.heads_per_program)
        if min(self.num_warps, self.layers_per_program) < 1 or any(v is not None and v < 1 for v in optional):
            raise ValueError(f"tuning values must be positive: {self}")
        if self.l2_prefetch and (not self.one_trip_start or self.load_all_tiles):
            raise ValueError(f"l2_prefetch is a step of the one-trip in-place grid program: {self}")


_DEFAULT_TUNINGS: list[tuple[bool, str, int, KernelTuning]] = [
    # (fp8, op, up to this many K head-blocks, tuning); the first match wins
    (False, "copy", 21673, KernelTuning(layers_per_program=4, max_registers=32)),
    (False, "copy", 43347, KernelTuning(layers_per_program=8)),
    (False, "copy", 86695, KernelTuning(num_warps=8, layers_per_program=4, max_registers=64)),
    (False, "copy", 173391, KernelTuning(layers_per_program=8)),
    (False, "copy", 1 << 62, KernelTuning(layers_per_program=4)),
    (
        False,
        "inplace",
        10836,
        KernelTuning(
            layers_per_program=1, heads_per_program=2, layers_fastest=True, one_trip_start=True, l2_prefetch=True
        ),
    ),
    (False, "inplace", 21673, KernelTuning(layers_per_program=1, layers_fastest=True, one_trip_start=True)),
    (
        False,
        "inplace",
        43347,
        KernelTuning(
            num_warps=8,
            layers_per_program=1,
            heads_per_program=2,
            layers_fastest=True,
            one_trip_start=True,
            l2_prefetch=True,
        ),
    ),
    (False, "inplace", 86695, KernelTuning(layers_per_program=1, layers_fastest=True, one_trip_start=True)),
    (False, "inplace", 173391, KernelTuning(layers_per_program=8)),
    (False, "inplace", 1 << 62, KernelTuning(layers_per_program=1, layers_fastest=True, one_trip_start=True)),
    (
        True,
        "copy",
        10836,
        KernelTuning(
            num_warps=4,
            layers_per_program=1,
            max_registers=None,
            heads_per_program=4,
            load_all_tiles=True,
            one_trip_start=True,
        ),
    ),
    (True, "copy", 21673, KernelTuning(num_warps=4, layers_per_program=8, max_registers=64, heads_per_program=2)),
    (True, "copy", 43347, KernelTuning(num_warps=4, layers_per_program=4, max_registers=None)),
    (True, "copy", 86695, KernelTuning(num_warps=4, max_registers=None)),
    (True, "copy", 173391, KernelTuning(num_warps=4, layers_per_program=8, max_registers=None, heads_per_program=4)),
    (True, "copy", 1 << 62, KernelTuning(num_warps=4, max_registers=None)),
    (
        True,
        "inplace",
        21673,
        KernelTuning(
            num_warps=4,
            layers_per_program=1,
            max_registers=None,
            heads_per_program=4,
            load_all_tiles=True,
            one_trip_start=True,
        ),
    ),
    (True, "inplace", 43347, KernelTuning(num_warps=4, max_registers=64)),
    (True, "inplace", 86695, KernelTuning(num_warps=4, layers_per_program=8, max_registers=64, heads_per_program=2)),
    (True, "inplace", 1 << 62, KernelTuning(num_warps=4, max_registers=64)),
]
"""Written by benchmarks/pick_rope_defaults.py from the H200 per-size sweep of the final issue 16.4 code
(benchmarks/results/rope_delta_h200_issue16_final_code.txt; docs/benchmarks.md): each benchmarked size gets its best
setting, up to the geometric midpoint of its K head-blocks and the next size's. fp8 in place up to 2K tokens: the
load-all-tiles programs, best at both 2K sizes in the session-9 H200 sweep (benchmarks/results/kern5/). bf16 in place
up to 43347 head-blocks (Llama-3-8B 2K, Qwen2.5-7B 2K and 8K): 16 warps, 1 layer per program, 40 registers,
layers-fastest program order, from the session-10 H200 short sweep (benchmarks/results/kern7/h200/; best at Llama 2K
and Qwen 8K, 0.1 point of copy bandwidth behind the best at Qwen 2K; replaced 8 warps / 4 layers uncapped up to 21673
and 16 warps / 8 layers / 40 registers up to 43347). The one-trip start (``one_trip_start``) on the bf16 in-place
entry up to 43347, the fp8 in-place entry up to 21673 and a new fp8 copy entry up to 10836 (load-all-tiles, 4 heads a
program): the session-12 H200 short sweep's best at every one of those cases (benchmarks/results/kern10/h200/). bf16
in place above 173391 head-blocks and from 43348 to 86695 (Llama-3-8B 32K and 8K) the same layers-fastest one-trip
setting, 2-3 points ahead of the per-size sweep's at both in two session-13 H200 calls (benchmarks/results/kern12/h200/,
benchmarks/results/session13/kernel_8k_32k/); at Qwen2.5-7B 32K the two tie, and `layers_per_program=8` stays. bf16
in place up to 10836 head-blocks (Qwen2.5-7B 2K) and from 21674 to 43347 (Qwen2.5-7B 8K): two heads a program with
the L2 prefetch (``l2_prefetch``; 8 warps at 8K), ahead of the one-trip setting by 1.4-2.3 points in two session-14
H200 calls (benchmarks/results/kern13/); at Llama-3-8B 2K and 8K it is behind, and the one-trip setting stays. bf16
copy up to 21673 head-blocks (2K tokens): 16 warps, 4 layers a program, 32 registers, since session 29 took the group
loop out of the grid kernels; the old 8-warp setting then needed fewer registers, fit 5 programs a multiprocessor
instead of 4 and lost 2-3%, while this one matched or beat the old default at both 2K sizes
(benchmarks/results/session29/). The sizes: 2K / 8K / 32K tokens of Qwen2.5-7B (7168 / 28672 / 114688 head-blocks)
and of Llama-3-8B (16384 / 65536 / 262144)."""


def default_tuning(dtype: torch.dtype, op: Literal["copy", "inplace"], head_blocks: int) -> KernelTuning:
    """The launch the public functions use when the caller passes none: by KV dtype, operation and size.

    ``head_blocks``: row groups x layers x KV heads, the number of (block, layer, head) K tiles a launch rotates.
    """
    fp8 = dtype == FP8_KV_DTYPE
    return next(t for f, o, most, t in _DEFAULT_TUNINGS if f == fp8 and o == op and head_blocks <= most)


def split_spans_to_plan(
    spans: Iterable[CopySpan], src_block_ids: list[int], dst_block_ids: list[int], tokens_per_block: int
) -> torch.Tensor:
    """Copy-plan rows (int64 ``[S, 6]`` on CPU) for token spans over the donor's and the target's block lists.

    Called by the connector when it builds a materialization plan. Each span is cut wherever either side crosses a
    block boundary. Raises `InvalidPlan` for spans outside the block lists.
    """
    src_ids, dst_ids = np.asarray(src_block_ids, dtype=np.int64), np.asarray(dst_block_ids, dtype=np.int64)
    parts = []
    for span in spans:
        delta = span.dst_start - span.src_start if span.delta is None else span.delta
        _check_span(span.src_start, span.n_tokens, len(src_ids), tokens_per_block, "source")
        _check_span(span.dst_start, span.n_tokens, len(dst_ids), tokens_per_block, "target")
        starts = _cuts(span.n_tokens, tokens_per_block, span.src_start, span.dst_start)
        n = np.diff(np.append(starts, span.n_tokens))
        src, dst = span.src_start + starts, span.dst_start + starts
        block_src, block_dst = src_ids[src // tokens_per_block], dst_ids[dst // tokens_per_block]
        offsets_src, offsets_dst = src % tokens_per_block, dst % tokens_per_block
        deltas = np.full_like(n, delta)
        parts.append(np.stack([block_src, offsets_src, block_dst, offsets_dst, n, deltas], axis=1))
    return _rows(parts, COPY_PLAN_COLUMNS)


def split_inplace_spans_to_plan(
    spans: Iterable[InplaceSpan], block_ids: list[int], tokens_per_block: int
) -> torch.Tensor:
    """In-place plan rows (int64 ``[S, 4]`` on CPU) for token spans over one request's block list."""
    ids = np.asarray(block_ids, dtype=np.int64)
    parts = []
    for span in spans:
        _check_span(span.start, span.n_tokens, len(ids), tokens_per_block, "")
        starts = _cuts(span.n_tokens, tokens_per_block, span.start)
        n = np.diff(np.append(starts, span.n_tokens))
        pos = span.start + starts
        parts.append(
            np.stack([ids[pos // tokens_per_block], pos % tokens_per_block, n, np.full_like(n, span.delta)], 1)
        )
    return _rows(parts, INPLACE_PLAN_COLUMNS)


def _cuts(n_tokens: int, tokens_per_block: int, *starts: int) -> np.ndarray:
    """Span-relative indices where a row starts: 0 and every block boundary of any side inside the span."""
    firsts = [np.arange((-s) % tokens_per_block, n_tokens, tokens_per_block) for s in starts]
    return np.unique(np.concatenate([np.zeros(min(n_tokens, 1), dtype=np.int64), *firsts]))


def _rows(parts: list[np.ndarray], columns: int) -> torch.Tensor:
    if not parts:
        return torch.empty(0, columns, dtype=torch.int64)
    return torch.from_numpy(np.concatenate(parts).astype(np.int64).reshape(-1, columns))


def _check_span(start: int, n_tokens: int, num_blocks: int, tokens_per_block: int, side: str) -> None:
    if start < 0 or n_tokens < 0 or start + n_tokens > num_blocks * tokens_per_block:
        raise InvalidPlan(
            f"{side} span [{start}, {start + n_tokens}) is outside {num_blocks} blocks of {tokens_per_block} tokens"
        )


def uses_triton(pool: torch.Tensor) -> bool:
    """Whether the public functions run the Triton kernels (not the torch reference) for ``pool``."""
    return triton is not None and (pool.is_cuda or _INTERPRETED)


# ---------------------------------------------------------------------------------------------------------------------
# Triton kernels
# ---------------------------------------------------------------------------------------------------------------------

if triton is not None:
    _GROUP_COLS = tl.constexpr(GROUP_COLUMNS)
    _INV_TWO_PI = tl.constexpr(0.15915494309189535)
    # 2*pi split so that k * _TWO_PI_HI and k * _TWO_PI_MID are exact for |k| < 2**15 (|angle| up to ~2e5 rad).
    _TWO_PI_HI = tl.constexpr(6.28125)
    _TWO_PI_MID = tl.constexpr(0.001934051513671875)
    _TWO_PI_LO = tl.constexpr(1.2556658930407139e-06)
    _TWO_OVER_PI = tl.constexpr(0.6366197723675814)
    # pi/2 split the same way (the quotient is at most 2 in magnitude here, so every product is exact).
    _HALF_PI_HI = tl.constexpr(1.5703125)
    _HALF_PI_MID = tl.constexpr(4.837512969970703125e-4)
    _HALF_PI_LO = tl.constexpr(7.54978995489188216e-8)

    @triton.jit
    def _unit_cos_sin(inv_freq_ptr, delta, ROTARY_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
        """cos/sin of delta * inv_freq in fp32 (every token of a row group shares the delta).

        Explicit range reductions, to [-pi, pi] and then to [-pi/4, pi/4] and a quadrant, and short polynomials
        (within 2 fp32 ulps): a library sin/cos also carries a slow path for huge arguments that costs registers.
        """
        j = tl.arange(0, BLOCK_HALF)
        inv = tl.load(inv_freq_ptr + j, mask=j < ROTARY_DIM // 2, other=0.0)
        theta = delta.to(tl.float32) * inv
        k = tl.floor(theta * _INV_TWO_PI + 0.5)
        r = theta - k * _TWO_PI_HI
        r = r - k * _TWO_PI_MID
        r = r - k * _TWO_PI_LO
        q = tl.floor(r * _TWO_OVER_PI + 0.5)  # -2 .. 2
        y = r - q * _HALF_PI_HI
        y = y - q * _HALF_PI_MID
        y = y - q * _HALF_PI_LO
        z = y * y
        sin_y = y + y * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4))
        cos_y = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5))
        quadrant = q.to(tl.int32) & 3
        swap = (quadrant & 1) != 0
        sin = tl.where(swap, cos_y, sin_y)
        cos = tl.where(swap, sin_y, cos_y)
        return tl.where(((quadrant + 1) & 2) != 0, -cos, cos), tl.where((quadrant & 2) != 0, -sin, sin)

    @triton.jit
    def _to_storage(x, DTYPE: tl.constexpr, INTERPRETED: tl.constexpr):
        """Round fp32 to the KV dtype, to nearest even (fp8: saturating at +-448, as TensorRT-LLM quantizes).

        On the GPU this is the hardware conversion (cvt.rn; fp8: cvt.rn.satfinite). Triton's interpreter truncates
        fp32 -> bf16 casts, and its fp32 -> fp8 cast rounds halves up and mangles subnormals and large values, so
        under the interpreter both are rounded by hand, and the CPU tests see the GPU's rounding.
        """
        if INTERPRETED and tl.bfloat16 == DTYPE:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        elif INTERPRETED and tl.float8e4nv == DTYPE:
            return _fp8_e4m3_rne(tl.minimum(tl.maximum(x, -448.0), 448.0))
        else:
            return x.to(DTYPE)

    @triton.jit
    def _fp8_e4m3_rne(x):
        """fp32 in [-448, 448] -> e4m3fn, round to nearest even, with integer and exact fp32 ops only."""
        bits = x.to(tl.uint32, bitcast=True)
        sign = (bits >> 24) & 0x80
        mag = tl.abs(x)
        # Normal range (>= 2**-6): round the fp32 mantissa to 3 bits, then rebias the exponent from 127 to 7.
        m = mag.to(tl.uint32, bitcast=True)
        normal = ((m + 0x7FFFF + ((m >> 20) & 1)) >> 20) - (120 << 3)
        # Subnormal range: multiples of 2**-9; adding then subtracting 2**23 rounds to nearest even in fp32.
        sub = ((mag * 512.0 + 8388608.0) - 8388608.0).to(tl.uint32)
        code = tl.where(mag < 0.015625, sub, normal) | sign
        return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)

    @triton.jit
    def _load_rotary(src3, off, rows, ROTARY_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr, IS_NEOX: tl.constexpr):
        """The rotary channels of ``R`` K tiles as stored (neox: its two halves, gptj: the interleaved pairs, twice).

        ``src3``: ``[1, BLOCK_T, 1]`` pointers to each lane's token; ``off``: ``[R, 1, 1]`` offsets of the tiles (a
        head, or a layer and a head) from there; ``rows``: ``[R, BLOCK_T, 1]``, which (tile, lane) exist.
        """
        if IS_NEOX:
            j = tl.arange(0, BLOCK_HALF)[None, None, :]
            mask = rows & (j < ROTARY_DIM // 2)
            off1 = off + j
            return tl.load(src3 + off1, mask=mask), tl.load(src3 + off1 + ROTARY_DIM // 2, mask=mask)
        else:
            cols = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
            x = tl.load(src3 + off + cols, mask=rows & (cols < ROTARY_DIM))
            return x, x

    @triton.jit
    def _store_rotated(
        dst3,
        off,
        rows,
        a,
        b,
        c,
        s,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        R: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Rotate what `_load_rotary` loaded in fp32 and store it, rounded, at ``dst3`` (``off`` and ``rows`` as
        there)."""
        if IS_NEOX:
            j = tl.arange(0, BLOCK_HALF)[None, None, :]
            mask = rows & (j < ROTARY_DIM // 2)
            off1 = off + j
            x1 = a.to(tl.float32)
            x2 = b.to(tl.float32)
            tl.store(dst3 + off1, _to_storage(x1 * c - x2 * s, dst3.dtype.element_ty, INTERPRETED), mask=mask)
            tl.store(
                dst3 + off1 + ROTARY_DIM // 2,
                _to_storage(x2 * c + x1 * s, dst3.dtype.element_ty, INTERPRETED),
                mask=mask,
            )
        else:
            cols = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
            x1, x2 = tl.split(tl.reshape(a.to(tl.float32), (R, BLOCK_T, BLOCK_HALF, 2)))
            out = tl.reshape(tl.join(x1 * c - x2 * s, x2 * c + x1 * s), (R, BLOCK_T, 2 * BLOCK_HALF))
            tl.store(
                dst3 + off + cols,
                _to_storage(out, dst3.dtype.element_ty, INTERPRETED),
                mask=rows & (cols < ROTARY_DIM),
            )

    @triton.jit
    def _rotate_heads(
        src,
        dst,
        live,
        cos,
        sin,
        stride_h,
        head_first,
        head_stop,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Rotate the first ROTARY_DIM channels of K of heads ``[head_first, head_stop)`` for the ``live`` lanes, one
        head at a time.

        ``src`` / ``dst`` point at head 0, channel 0 of each lane's token (``[BLOCK_T]`` pointers). fp8 codes are
        rotated as they are stored: the rotation is linear, so the layer's dequantization and requantization scales
        cancel (up to fp32 rounding, which the one-step bound covers) and need no multiply per element.
        """
        src3 = src[None, :, None]
        dst3 = dst[None, :, None]
        rows = live[None, :, None]
        c = cos[None, None, :]
        s = sin[None, None, :]
        for head in range(head_first, head_stop):
            off = head * stride_h
            a, b = _load_rotary(src3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            _store_rotated(dst3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, 1, BLOCK_HALF, IS_NEOX, INTERPRETED)

    @triton.jit
    def _copy_heads(
        src,
        dst,
        live,
        start: tl.constexpr,
        stop: tl.constexpr,
        stride_h,
        head_first,
        head_stop,
        BLOCK_HALF: tl.constexpr,
    ):
        """Copy channels ``[start, stop)`` of heads ``[head_first, head_stop)`` for the ``live`` lanes.

        In tiles of the rotation's shape, two per step, both loaded before either is stored: the lane pointers stay in
        one register layout for both paths.
        """
        j = tl.arange(0, BLOCK_HALF)[None, None, :]
        src3 = src[None, :, None]
        dst3 = dst[None, :, None]
        rows = live[None, :, None]
        for head in range(head_first, head_stop):
            for c0 in tl.static_range(start, stop, 2 * BLOCK_HALF):
                mask1 = rows & (c0 + j < stop)
                mask2 = rows & (c0 + BLOCK_HALF + j < stop)
                off1 = head * stride_h + c0 + j
                off2 = off1 + BLOCK_HALF
                x1 = tl.load(src3 + off1, mask=mask1)
                x2 = tl.load(src3 + off2, mask=mask2)
                tl.store(dst3 + off1, x1, mask=mask1)
                tl.store(dst3 + off2, x2, mask=mask2)

    @triton.jit
    def _group_rows(plan, first, count, COLS: tl.constexpr, DST: tl.constexpr, BLOCK_T: tl.constexpr):
        """For each lane, the row (counted from ``first``) of the group that writes it, or -1 where none does.

        A group is ``count`` (<= tokens_per_block) consecutive plan rows with one target block and one delta, so lane
        t stands for target slot t, each lane has at most one row, and partial rows share one tile.
        """
        j = tl.arange(0, BLOCK_T)
        rows = plan + (first + j) * COLS
        dst_off = tl.load(rows + DST + 1, mask=j < count, other=0)
        n_tokens = tl.load(rows + COLS - 2, mask=j < count, other=0)
        lane = j[:, None]
        match = (dst_off[None, :] <= lane) & (lane < (dst_off + n_tokens)[None, :])
        return tl.sum(tl.where(match, j[None, :] + 1, 0), axis=1) - 1

    @triton.jit
    def _program_range(count, per_program, axis: tl.constexpr):
        """This program's ``[first, stop)`` of ``count`` units dealt out ``per_program`` at a time along ``axis``."""
        first = tl.program_id(axis) * per_program
        return first, tl.minimum(first + per_program, count)

    @triton.jit
    def _load_group(desc):
        """A row group's rows, target block and delta (the rest of its descriptor is read where needed)."""
        return tl.load(desc + 1), tl.load(desc + 2), tl.load(desc + 3)

    @triton.jit
    def _copy_group(
        pool,
        plan,
        desc,
        inv_freq,
        layer_first,
        layer_stop,
        kv,
        head_first,
        head_stop,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Copy K (rotated by the group's delta) or V (``kv``) of the row group at ``desc``, layers
        ``[layer_first, layer_stop)`` and heads ``[head_first, head_stop)``."""
        count, block, delta = _load_group(desc)
        cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)
        lane = tl.arange(0, BLOCK_T)
        dst_lane = block * stride_b + lane.to(tl.int64) * stride_t
        if count == 1:  # one row: its slots and source come with the group (no trip to the plan)
            dst_off = tl.load(desc + 4)
            live = (lane >= dst_off) & (lane < dst_off + tl.load(desc + 5))
            src_lane = tl.load(desc + 6) * stride_b + (lane + tl.load(desc + 7)) * stride_t
        else:
            first = tl.load(desc)
            which = _group_rows(plan, first, count, 6, 2, BLOCK_T)
            live = which >= 0
            row = plan + (first + which) * 6
            src_block = tl.load(row, mask=live, other=0)
            shift = tl.load(row + 1, mask=live, other=0) - tl.load(row + 3, mask=live, other=0)
            src_lane = src_block * stride_b + (lane + shift) * stride_t
        for layer in range(layer_first, layer_stop):
            inner = layer * stride_l + kv * stride_kv  # below one block stride: int32 is enough
            src = pool + inner + src_lane
            dst = pool + inner + dst_lane
            if (kv == 1) | (delta == 0):
                _copy_heads(src, dst, live, 0, HEAD_DIM, stride_h, head_first, head_stop, BLOCK_HALF)
            else:
                _rotate_heads(
                    src,
                    dst,
                    live,
                    cos,
                    sin,
                    stride_h,
                    head_first,
                    head_stop,
                    ROTARY_DIM,
                    BLOCK_T,
                    BLOCK_HALF,
                    IS_NEOX,
                    INTERPRETED,
                )
                if ROTARY_DIM < HEAD_DIM:
                    _copy_heads(
                        src,
                        dst,
                        live,
                        ROTARY_DIM,
                        HEAD_DIM,
                        stride_h,
                        head_first,
                        head_stop,
                        BLOCK_HALF,
                    )

    @triton.jit
    def _inplace_group(
        pool,
        plan,
        desc,
        inv_freq,
        layer_first,
        layer_stop,
        head_first,
        head_stop,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Rotate K of the row group at ``desc`` in place by the group's delta (0: nothing), layers
        ``[layer_first, layer_stop)`` and heads ``[head_first, head_stop)``."""
        count, block, delta = _load_group(desc)
        cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)
        if delta != 0:
            lane = tl.arange(0, BLOCK_T)
            k_lane = block * stride_b + lane.to(tl.int64) * stride_t
            if count == 1:  # one row: its slots come with the group (no trip to the plan)
                dst_off = tl.load(desc + 4)
                live = (lane >= dst_off) & (lane < dst_off + tl.load(desc + 5))
            else:
                live = _group_rows(plan, tl.load(desc), count, 4, 0, BLOCK_T) >= 0
            for layer in range(layer_first, layer_stop):
                k = pool + layer * stride_l + k_lane
                _rotate_heads(
                    k,
                    k,
                    live,
                    cos,
                    sin,
                    stride_h,
                    head_first,
                    head_stop,
                    ROTARY_DIM,
                    BLOCK_T,
                    BLOCK_HALF,
                    IS_NEOX,
                    INTERPRETED,
                )

    @triton.jit
    def _prefetch_l2(ptr, nbytes):
        """One bulk prefetch of ``nbytes`` (a multiple of 16) from ``ptr`` (16-byte aligned) into L2, issued by the
        program's thread 0 (sm_90's ``cp.async.bulk.prefetch.L2``; no registers held, nothing to wait for)."""
        addr = (ptr + tl.zeros([1], dtype=tl.int32)).to(tl.int64)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [addr, nbytes + tl.zeros([1], dtype=tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _inplace_one_group(
        pool,
        plan,
        desc,
        inv_freq,
        layer_first,
        layer_stop,
        head_first,
        head_stop,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        PREFETCH_ELEM_BYTES: tl.constexpr = 0,
    ):
        """Rotate K of the one row group at ``desc`` in place (delta 0: nothing), layers ``[layer_first,
        layer_stop)`` x heads ``[head_first, head_stop)``, one head tile at a time (heads counted fastest).

        The descriptor is read in one round trip (a one-row group's slots come with it), and the first tile's loads
        are issued before cos/sin are computed (`KernelTuning.one_trip_start`): the grid kernel reads the delta,
        computes cos/sin, reads the row count and block, then the slots, before its first data load.

        ``PREFETCH_ELEM_BYTES`` (`KernelTuning.l2_prefetch`): first, one bulk L2 prefetch per layer of the program's
        heads (contiguous, head-major)."""
        block, delta, live, _, _ = _whole_group(plan, desc, 4, 0, BLOCK_T, True)
        if PREFETCH_ELEM_BYTES != 0:  # noqa: SIM102 (a compile-time branch: off, the kernel has no trace of it)
            if delta != 0:
                chunk = pool + block * stride_b + head_first * stride_h
                nbytes = ((head_stop - head_first) * stride_h * PREFETCH_ELEM_BYTES).to(tl.int32)
                for layer in range(layer_first, layer_stop):
                    _prefetch_l2(chunk + layer * stride_l, nbytes)
        if delta != 0:
            k3 = (pool + block * stride_b + tl.arange(0, BLOCK_T).to(tl.int64) * stride_t)[None, :, None]
            rows = live[None, :, None]
            off = layer_first * stride_l + head_first * stride_h
            a, b = _load_rotary(k3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)  # while the first tile is in flight
            c = cos[None, None, :]
            s = sin[None, None, :]
            _store_rotated(k3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, 1, BLOCK_HALF, IS_NEOX, INTERPRETED)
            heads = head_stop - head_first
            next_layer = stride_l - heads * stride_h  # from a layer's last head to the next layer's first
            head = head_first
            for _t in range(1, (layer_stop - layer_first) * heads):
                head += 1
                off += stride_h
                if head == head_stop:
                    head = head_first
                    off += next_layer
                a, b = _load_rotary(k3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
                _store_rotated(k3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, 1, BLOCK_HALF, IS_NEOX, INTERPRETED)

    # Sizes that change from call to call are not specialized on (no recompiles on the serving path).
    _RUNTIME_SIZES = ["layer_start", "layer_stop", "layers_per_prog"]

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def _rope_delta_copy_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
    ):
        """One program per (row group, run of layers, K|V x run of heads): gather the group's tokens, rotate K, write.
        Axis 2 counts head runs of K, then of V."""
        layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
        head_runs = tl.cdiv(num_heads, heads_per_prog)
        kv = tl.program_id(2) // head_runs
        head_first = (tl.program_id(2) % head_runs) * heads_per_prog
        head_stop = tl.minimum(head_first + heads_per_prog, num_heads)
        _copy_group(
            pool,
            plan,
            groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS,
            inv_freq,
            layer_start + layer_first,
            layer_start + layer_end,
            kv,
            head_first,
            head_stop,
            stride_b,
            stride_l,
            stride_kv,
            stride_h,
            stride_t,
            HEAD_DIM,
            ROTARY_DIM,
            BLOCK_T,
            BLOCK_HALF,
            IS_NEOX,
            INTERPRETED,
        )

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def _rope_delta_inplace_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
        ONE_TRIP_START: tl.constexpr = False,
        PREFETCH_ELEM_BYTES: tl.constexpr = 0,
    ):
        """One program per (row group, run of layers, run of heads): rotate the group's K in place; delta 0 does
        nothing. ``ONE_TRIP_START``: `_inplace_one_group` (with its ``PREFETCH_ELEM_BYTES``)."""
        desc = groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS
        layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
        head_first, head_stop = _program_range(num_heads, heads_per_prog, 2)
        if ONE_TRIP_START:
            _inplace_one_group(
                pool,
                plan,
                desc,
                inv_freq,
                layer_start + layer_first,
                layer_start + layer_end,
                head_first,
                head_stop,
                stride_b,
                stride_l,
                stride_h,
                stride_t,
                ROTARY_DIM,
                BLOCK_T,
                BLOCK_HALF,
                IS_NEOX,
                INTERPRETED,
                PREFETCH_ELEM_BYTES,
            )
        else:
            _inplace_group(
                pool,
                plan,
                desc,
                inv_freq,
                layer_start + layer_first,
                layer_start + layer_end,
                head_first,
                head_stop,
                stride_b,
                stride_l,
                stride_h,
                stride_t,
                ROTARY_DIM,
                BLOCK_T,
                BLOCK_HALF,
                IS_NEOX,
                INTERPRETED,
            )

    @triton.jit
    def _tile_offsets(layer_first, layer_stop, head_first, head_stop, stride_l, stride_h, TILES: tl.constexpr):
        """A program's tiles, layers ``[layer_first, layer_stop)`` x heads ``[head_first, head_stop)`` (heads counted
        fastest): their offsets from a token's layer 0, head 0 and which exist, both ``[TILES, 1, 1]``."""
        t = tl.arange(0, TILES)
        heads = head_stop - head_first
        off = (layer_first + t // heads) * stride_l + (head_first + t % heads) * stride_h
        return off[:, None, None], (t < (layer_stop - layer_first) * heads)[:, None, None]

    @triton.jit
    def _whole_group(
        plan, desc, COLS: tl.constexpr, DST: tl.constexpr, BLOCK_T: tl.constexpr, ONE_TRIP: tl.constexpr = False
    ):
        """The row group at ``desc`` with every column read at once (one round trip: a one-row group's slots and
        source are not read after its row count): its target block, delta, and per lane whether a row writes it
        and that row's source block and source-minus-target offset (copy plans, ``COLS`` 6; zeros in place).

        ``ONE_TRIP``: a one-row group's lanes and source are computed before the branch on the row count; otherwise
        the compiler sinks the loads of its slots into that branch, after the row count has arrived (two round trips
        in the sm_90a SASS)."""
        first = tl.load(desc)
        count, block, delta = _load_group(desc)
        dst_off = tl.load(desc + 4)
        n_tokens = tl.load(desc + 5)
        one_src = tl.load(desc + 6)
        one_shift = tl.load(desc + 7)
        lane = tl.arange(0, BLOCK_T)
        zero = tl.zeros([BLOCK_T], dtype=tl.int64)
        if ONE_TRIP:
            live = (lane >= dst_off) & (lane < dst_off + n_tokens)
            src_block = zero + one_src
            shift = zero + one_shift
            if count != 1:
                which = _group_rows(plan, first, count, COLS, DST, BLOCK_T)
                live = which >= 0
                if COLS == 6:
                    row = plan + (first + which) * 6
                    src_block = tl.load(row, mask=live, other=0)
                    shift = tl.load(row + 1, mask=live, other=0) - tl.load(row + 3, mask=live, other=0)
        elif count == 1:
            live = (lane >= dst_off) & (lane < dst_off + n_tokens)
            src_block = zero + one_src
            shift = zero + one_shift
        else:
            which = _group_rows(plan, first, count, COLS, DST, BLOCK_T)
            live = which >= 0
            if COLS == 6:
                row = plan + (first + which) * 6
                src_block = tl.load(row, mask=live, other=0)
                shift = tl.load(row + 1, mask=live, other=0) - tl.load(row + 3, mask=live, other=0)
            else:
                src_block = zero
                shift = zero
        return block, delta, live, src_block, shift

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def _rope_delta_copy_tiles_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        TILES: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        BLOCK_D: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
        ONE_TRIP_START: tl.constexpr = False,
    ):
        """One program per (row group, run of layers, K|V x run of heads) that loads all its tiles (one tensor of
        ``TILES`` x ``BLOCK_T`` lanes) before storing any; K is rotated, V copied. Axis 2 as in the grid kernel.
        ``ONE_TRIP_START``: `_whole_group`'s ``ONE_TRIP``."""
        block, delta, live, src_block, shift = _whole_group(
            plan, groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS, 6, 2, BLOCK_T, ONE_TRIP_START
        )
        layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
        head_runs = tl.cdiv(num_heads, heads_per_prog)
        kv = tl.program_id(2) // head_runs
        head_first = (tl.program_id(2) % head_runs) * heads_per_prog
        head_stop = tl.minimum(head_first + heads_per_prog, num_heads)
        lane = tl.arange(0, BLOCK_T)
        dst_lane = block * stride_b + lane.to(tl.int64) * stride_t
        src_lane = src_block * stride_b + (lane + shift) * stride_t
        off, tiles = _tile_offsets(
            layer_start + layer_first, layer_start + layer_end, head_first, head_stop, stride_l, stride_h, TILES
        )
        off = off + kv * stride_kv
        src3 = (pool + src_lane)[None, :, None]
        dst3 = (pool + dst_lane)[None, :, None]
        rows = tiles & live[None, :, None]
        d = tl.arange(0, BLOCK_D)[None, None, :]
        if (kv == 1) | (delta == 0):
            mask = rows & (d < HEAD_DIM)
            tl.store(dst3 + off + d, tl.load(src3 + off + d, mask=mask), mask=mask)
        else:
            if ROTARY_DIM < HEAD_DIM:  # channels past rotary_dim are copied: loaded with the rest
                rest = rows & (ROTARY_DIM + d < HEAD_DIM)
                kept = tl.load(src3 + off + ROTARY_DIM + d, mask=rest)
            a, b = _load_rotary(src3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)  # while the tiles are in flight
            c = cos[None, None, :]
            s = sin[None, None, :]
            _store_rotated(dst3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, TILES, BLOCK_HALF, IS_NEOX, INTERPRETED)
            if ROTARY_DIM < HEAD_DIM:
                tl.store(dst3 + off + ROTARY_DIM + d, kept, mask=rest)

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def _rope_delta_inplace_tiles_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        TILES: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
        ONE_TRIP_START: tl.constexpr = False,
    ):
        """One program per (row group, run of layers, run of heads) that loads all its K tiles (one tensor of
        ``TILES`` x ``BLOCK_T`` lanes) before storing any: reads and writes go through the same pointer, so the
        compiler cannot overlap one tile's load with the previous tile's store; here every load is issued first.
        ``ONE_TRIP_START``: `_whole_group`'s ``ONE_TRIP``."""
        block, delta, live, _, _ = _whole_group(
            plan, groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS, 4, 0, BLOCK_T, ONE_TRIP_START
        )
        if delta != 0:
            layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
            head_first, head_stop = _program_range(num_heads, heads_per_prog, 2)
            off, tiles = _tile_offsets(
                layer_start + layer_first, layer_start + layer_end, head_first, head_stop, stride_l, stride_h, TILES
            )
            k3 = (pool + block * stride_b + tl.arange(0, BLOCK_T).to(tl.int64) * stride_t)[None, :, None]
            rows = tiles & live[None, :, None]
            a, b = _load_rotary(k3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)  # while the tiles are in flight
            c = cos[None, None, :]
            s = sin[None, None, :]
            _store_rotated(k3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, TILES, BLOCK_HALF, IS_NEOX, INTERPRETED)

    _INTERPRETED = type(_rope_delta_copy_kernel).__name__ == "InterpretedFunction"
else:
    _INTERPRETED = False


# ---------------------------------------------------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------------------------------------------------


class _Checked(NamedTuple):
    plan: torch.Tensor  # int64, contiguous, on the pool's device
    groups: torch.Tensor  # int64 [G, GROUP_COLUMNS], on the pool's device: the row groups (`_row_groups`)
    inv_freq: torch.Tensor  # fp32, contiguous, on the pool's device
    kv_scale: torch.Tensor | None  # fp32 [num_layers] or [1], contiguous (fp8 pools only)
    layer_start: int
    layer_stop: int


def rope_delta_copy(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
    tuning: KernelTuning | None = None,
) -> None:
    """Materialize donor KV into target blocks per ``plan`` (``[S, 6]``), rotating K by each row's delta.

    Called on the forward stream before the target's prefill reads its blocks; enqueues work and returns (no sync
    beyond validating ``plan``). fp8 (``torch.float8_e4m3fn``) pools need ``kv_scale``, the cache's dequantization
    scale (fp32 ``[num_layers]`` or ``[1]``, on the pool's device); other dtypes take none. Raises `InvalidPlan`,
    `UnsupportedLayout` or `UnsupportedKVDtype` before touching the pool.
    """
    checked = _check(pool, plan, inv_freq, layout, rotary_dim, style, layers, COPY_PLAN_COLUMNS, kv_scale)
    if uses_triton(pool):
        tuning = tuning or default_tuning(pool.dtype, "copy", _head_blocks(checked, layout))
        _launch_copy(pool, checked, layout, rotary_dim, style, tuning)
    else:
        _copy_reference(pool, checked, layout, rotary_dim, style)


def rope_delta_inplace(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
    tuning: KernelTuning | None = None,
) -> None:
    """Rotate K of the slots in ``plan`` (``[S, 4]``) in place by each row's delta; V is left alone.

    Never call this on donor blocks that other requests may read: write into the target's own blocks. ``kv_scale``
    as for `rope_delta_copy`.
    """
    checked = _check(pool, plan, inv_freq, layout, rotary_dim, style, layers, INPLACE_PLAN_COLUMNS, kv_scale)
    if uses_triton(pool):
        tuning = tuning or default_tuning(pool.dtype, "inplace", _head_blocks(checked, layout))
        _launch_inplace(pool, checked, layout, rotary_dim, style, tuning)
    else:
        _inplace_reference(pool, checked, layout, rotary_dim, style)


def _launch_copy(
    pool: torch.Tensor, c: _Checked, layout: PagedKVLayout, rotary_dim: int, style: str, tune: KernelTuning
) -> Any:
    """Enqueue the copy kernel for an already validated plan (the benchmark times this alone); returns what Triton's
    launch returns (on the GPU the compiled kernel, whose register count the benchmark prints)."""
    if c.plan.shape[0] == 0:
        return None
    stride_b, stride_l, stride_kv, stride_h, stride_t = layout.kernel_strides(pool)
    kernel = _rope_delta_copy_tiles_kernel if tune.load_all_tiles else _rope_delta_copy_kernel
    return kernel[_grid(c, layout, tune, 2)](
        pool,
        c.plan,
        c.groups,
        c.inv_freq,
        c.layer_start,
        c.layer_stop,
        tune.layers_per_program,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        layout.num_kv_heads,
        _heads_per_program(layout, tune),
        num_warps=tune.num_warps,
        **_meta(layout, rotary_dim, style, tune, group_axis=_group_axis(c, tune)),
        HEAD_DIM=layout.head_dim,
        **({"BLOCK_D": triton.next_power_of_2(layout.head_dim)} if tune.load_all_tiles else {}),
        **({"ONE_TRIP_START": True} if tune.one_trip_start and tune.load_all_tiles else {}),
    )


def _launch_inplace(
    pool: torch.Tensor, c: _Checked, layout: PagedKVLayout, rotary_dim: int, style: str, tune: KernelTuning
) -> Any:
    """Enqueue the in-place kernel for an already validated plan; returns what Triton's launch returns."""
    if c.plan.shape[0] == 0:
        return None
    stride_b, stride_l, _, stride_h, stride_t = layout.kernel_strides(pool)
    kernel = _rope_delta_inplace_tiles_kernel if tune.load_all_tiles else _rope_delta_inplace_kernel
    return kernel[_grid(c, layout, tune, 1)](
        pool,
        c.plan,
        c.groups,
        c.inv_freq,
        c.layer_start,
        c.layer_stop,
        tune.layers_per_program,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        layout.num_kv_heads,
        _heads_per_program(layout, tune),
        num_warps=tune.num_warps,
        **_meta(layout, rotary_dim, style, tune, group_axis=_group_axis(c, tune)),
        **({"ONE_TRIP_START": True} if tune.one_trip_start else {}),
        **_prefetch_step(pool, layout, tune),
    )


def _prefetch_step(pool: torch.Tensor, layout: PagedKVLayout, tune: KernelTuning) -> dict[str, Any]:
    """The in-place one-trip program's `KernelTuning.l2_prefetch` argument where the pool allows it; none otherwise
    (the kernel then compiles as without it). Bytes per element: the bulk prefetch is sm_90 PTX (compiled kernels
    on a GPU of compute capability 9.0 or later, not the interpreter), and it needs the program's heads contiguous and
    16-byte aligned (head-major; a tile of tokens x head_dim a multiple of 16 bytes)."""
    item = pool.element_size()
    fits = (
        tune.l2_prefetch
        and not _INTERPRETED
        and _has_bulk_prefetch(pool.device)
        and layout.order == "head_major"
        and pool.data_ptr() % 16 == 0
        and layout.tokens_per_block * layout.head_dim * item % 16 == 0
    )
    return {"PREFETCH_ELEM_BYTES": item} if fits else {}


def _head_blocks(c: _Checked, layout: PagedKVLayout) -> int:
    return c.groups.shape[0] * (c.layer_stop - c.layer_start) * layout.num_kv_heads


def _heads_per_program(layout: PagedKVLayout, tune: KernelTuning) -> int:
    return min(tune.heads_per_program or layout.num_kv_heads, layout.num_kv_heads)


def _grid(c: _Checked, layout: PagedKVLayout, tune: KernelTuning, kv: int) -> tuple[int, int, int]:
    """One program per (row group, run of layers, K|V x run of heads); `_group_axis` says which axis counts groups."""
    groups = c.groups.shape[0]
    layer_runs = triton.cdiv(c.layer_stop - c.layer_start, tune.layers_per_program)
    head_runs = triton.cdiv(layout.num_kv_heads, _heads_per_program(layout, tune))
    if _group_axis(c, tune) == 1:
        return layer_runs, groups, kv * head_runs
    return groups, layer_runs, kv * head_runs


_MAX_GRID_Y = 65535
"""CUDA's limit on a grid's second dimension (the first allows 2**31 - 1)."""


def _group_axis(c: _Checked, tune: KernelTuning) -> int:
    """The grid axis that counts row groups: 1 with `KernelTuning.layers_fastest` (layer runs on axis 0, dispatched
    first), unless there are more groups than axis 1 allows; 0 otherwise."""
    return 1 if tune.layers_fastest and c.groups.shape[0] <= _MAX_GRID_Y else 0


@functools.cache
def _has_bulk_prefetch(device: torch.device) -> bool:
    """Whether ``cp.async.bulk.prefetch.L2`` exists on ``device`` (sm_90 and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def _meta(
    layout: PagedKVLayout, rotary_dim: int, style: str, tune: KernelTuning, *, group_axis: int = 0
) -> dict[str, Any]:
    registers = {} if tune.max_registers is None else {"maxnreg": tune.max_registers}
    common: dict[str, Any] = {
        "ROTARY_DIM": rotary_dim,
        "BLOCK_T": triton.next_power_of_2(layout.tokens_per_block),
        "BLOCK_HALF": triton.next_power_of_2(rotary_dim // 2),
        "IS_NEOX": style == "neox",
        "INTERPRETED": _INTERPRETED,
        "GROUP_AXIS": group_axis,
    }
    if tune.load_all_tiles:  # the tile count is fixed per layout and tuning (not per call: no recompiles)
        tiles = min(tune.layers_per_program, layout.num_layers) * _heads_per_program(layout, tune)
        return registers | common | {"TILES": triton.next_power_of_2(tiles)}
    return registers | common


# ---------------------------------------------------------------------------------------------------------------------
# Torch reference (CPU or GPU): the oracle for the kernels, and the fallback without Triton
# ---------------------------------------------------------------------------------------------------------------------


def rope_delta_copy_reference(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Torch implementation of `rope_delta_copy` (same contract), vectorized gather -> fp32 rotate -> scatter."""
    checked = _check(pool, plan, inv_freq, layout, rotary_dim, style, layers, COPY_PLAN_COLUMNS, kv_scale)
    _copy_reference(pool, checked, layout, rotary_dim, style)


def rope_delta_inplace_reference(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Torch implementation of `rope_delta_inplace` (same contract)."""
    checked = _check(pool, plan, inv_freq, layout, rotary_dim, style, layers, INPLACE_PLAN_COLUMNS, kv_scale)
    _inplace_reference(pool, checked, layout, rotary_dim, style)


def rotate_reference(
    x: torch.Tensor,
    delta: torch.Tensor,
    inv_freq: torch.Tensor,
    rotary_dim: int,
    style: str,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate ``x`` (``[N, ..., D]``; math in fp32) by per-row position deltas ``delta`` ``[N]``; a new tensor.

    fp8 ``x`` needs ``scale`` (fp32, broadcastable to ``x[..., :1]``): its rotary channels are dequantized with it,
    rotated, and requantized with it (nearest even, saturating). Channels past ``rotary_dim`` are kept as they are.
    """
    theta = delta.to(torch.float32)[:, None] * inv_freq.to(device=x.device, dtype=torch.float32)[None, :]
    shape = (theta.shape[0],) + (1,) * (x.dim() - 2) + (theta.shape[1],)
    cos, sin = theta.cos().reshape(shape), theta.sin().reshape(shape)
    r = x[..., :rotary_dim].to(torch.float32)
    if scale is not None:
        r = r * scale
    half = rotary_dim // 2
    if style == "neox":
        x1, x2 = r[..., :half], r[..., half:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    if scale is not None:
        out = out * torch.reciprocal(scale)
    result = _as_bytes(x.clone())
    result[..., :rotary_dim] = _as_bytes(_to_storage_reference(out, x.dtype))
    return result.view(x.dtype)


def _to_storage_reference(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == FP8_KV_DTYPE:
        x = x.clamp(-FP8_MAX, FP8_MAX)  # torch's fp8 cast rounds to nearest even; TensorRT-LLM saturates
    return x.to(dtype)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as uint8 (gathers, scatters and slices move bytes, whatever torch supports for fp8)."""
    return t.view(torch.uint8) if t.dtype == FP8_KV_DTYPE else t


def _layer_scale(c: _Checked) -> torch.Tensor | None:
    """The scale of each layer in ``[layer_start, layer_stop)``, shaped to broadcast over ``[N, L, H, D]``."""
    if c.kv_scale is None:
        return None
    scale = c.kv_scale if c.kv_scale.numel() == 1 else c.kv_scale[c.layer_start : c.layer_stop]
    return scale.reshape(1, -1, 1, 1)


def _expand_rows(plan: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row index, token index within its row) for plan rows of ``counts`` tokens."""
    row = torch.repeat_interleave(torch.arange(plan.shape[0], device=plan.device), counts)
    starts = torch.cumsum(counts, 0) - counts
    return row, torch.arange(row.numel(), device=plan.device) - starts[row]


def _copy_reference(pool: torch.Tensor, c: _Checked, layout: PagedKVLayout, rotary_dim: int, style: str) -> None:
    row, i = _expand_rows(c.plan, c.plan[:, 4])
    p = c.plan[row]
    tokens = layout.token_view(_as_bytes(pool))  # [NB, T, NL, 2, H, D]
    kv = tokens[p[:, 0], p[:, 1] + i, c.layer_start : c.layer_stop]  # gathered copy: [N, L, 2, H, D]
    k = kv[:, :, 0].view(pool.dtype)
    kv[:, :, 0] = _as_bytes(rotate_reference(k, p[:, 5], c.inv_freq, rotary_dim, style, _layer_scale(c)))
    tokens[p[:, 2], p[:, 3] + i, c.layer_start : c.layer_stop] = kv


def _inplace_reference(pool: torch.Tensor, c: _Checked, layout: PagedKVLayout, rotary_dim: int, style: str) -> None:
    row, i = _expand_rows(c.plan, c.plan[:, 2])
    p = c.plan[row]
    tokens = layout.token_view(_as_bytes(pool))
    index = (p[:, 0], p[:, 1] + i, slice(c.layer_start, c.layer_stop), 0)
    k = tokens[index].view(pool.dtype)
    tokens[index] = _as_bytes(rotate_reference(k, p[:, 3], c.inv_freq, rotary_dim, style, _layer_scale(c)))


# ---------------------------------------------------------------------------------------------------------------------
# Validation (shared by kernels and reference)
# ---------------------------------------------------------------------------------------------------------------------


def _check(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    rotary_dim: int,
    style: str,
    layers: tuple[int, int] | None,
    columns: int,
    kv_scale: torch.Tensor | None = None,
) -> _Checked:
    layout.check_pool(pool, kv_scale)
    if style not in ("neox", "gptj"):
        raise ValueError(f"style must be 'neox' or 'gptj', got {style!r}")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > layout.head_dim:
        raise ValueError(f"rotary_dim must be even and in (0, {layout.head_dim}], got {rotary_dim}")
    if inv_freq.dim() != 1 or inv_freq.numel() != rotary_dim // 2 or inv_freq.dtype != torch.float32:
        raise ValueError(f"inv_freq must be fp32 [{rotary_dim // 2}], got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    if not inv_freq.is_cuda and not bool(torch.isfinite(inv_freq).all()):  # no device sync on the serving path
        raise ValueError("inv_freq has non-finite values")
    start, stop = (0, layout.num_layers) if layers is None else layers
    if not 0 <= start < stop <= layout.num_layers:
        raise ValueError(f"layers must be [start, stop) within [0, {layout.num_layers}], got {layers}")
    if plan.dim() != 2 or plan.shape[1] != columns or plan.dtype != torch.int64:
        raise InvalidPlan(f"plan must be int64 [S, {columns}], got {plan.dtype} {tuple(plan.shape)}")
    rows = plan.cpu().numpy()
    _check_rows(rows, pool.shape[0], layout.tokens_per_block, columns)
    # One host-to-device copy carries the plan and its row groups.
    packed = torch.from_numpy(np.concatenate([rows.reshape(-1), _row_groups(rows, columns).reshape(-1)])).to(
        pool.device
    )
    return _Checked(
        packed[: rows.size].view(-1, columns),
        packed[rows.size :].view(-1, GROUP_COLUMNS),
        inv_freq.to(pool.device).contiguous(),
        None if kv_scale is None else kv_scale.contiguous(),
        int(start),
        int(stop),
    )


def _row_groups(plan: np.ndarray, columns: int) -> np.ndarray:
    """Runs of consecutive rows with one target block and one delta, int64 ``[G, GROUP_COLUMNS]`` (see there).

    The kernels give each group one tile of ``tokens_per_block`` lanes (lane = target slot): rows that share a block
    (spans at odd offsets) fill one tile together instead of two half-empty ones. A one-row group (aligned spans) also
    carries its row's slots and source, so its program starts loading after one read of the group.
    """
    copy = columns == COPY_PLAN_COLUMNS
    target = plan[:, 2 if copy else 0]
    delta = plan[:, columns - 1]
    new_group = np.append(plan.shape[0] > 0, (target[1:] != target[:-1]) | (delta[1:] != delta[:-1]))
    first = np.flatnonzero(new_group)
    count = np.diff(np.append(first, plan.shape[0]))
    groups = np.zeros((first.size, GROUP_COLUMNS), dtype=np.int64)
    groups[:, 0], groups[:, 1], groups[:, 2], groups[:, 3] = first, count, target[first], delta[first]
    one = first[count == 1]
    dst_offset = plan[one, 3 if copy else 1]
    groups[count == 1, 4] = dst_offset
    groups[count == 1, 5] = plan[one, columns - 2]
    if copy:
        groups[count == 1, 6] = plan[one, 0]
        groups[count == 1, 7] = plan[one, 1] - dst_offset
    return groups


def _check_rows(plan: np.ndarray, num_blocks: int, tokens_per_block: int, columns: int) -> None:
    """Bounds, one block per row, and no races: no slot written twice, no slot both read and written (copy)."""
    if plan.shape[0] == 0:
        return
    copy = columns == COPY_PLAN_COLUMNS
    n = plan[:, columns - 2]
    sides = [plan[:, 0:2], plan[:, 2:4]] if copy else [plan[:, 0:2]]
    for side in sides:
        block, offset = side[:, 0], side[:, 1]
        if ((block < 0) | (block >= num_blocks)).any():
            raise InvalidPlan(f"plan names a block outside [0, {num_blocks})")
        if ((offset < 0) | (n < 1) | (offset + n > tokens_per_block)).any():
            raise InvalidPlan(f"every plan row must hold 1.. tokens inside one block of {tokens_per_block} tokens")
    if (np.abs(plan[:, columns - 1]) > MAX_ABS_DELTA).any():
        raise InvalidPlan(f"|delta| must be at most {MAX_ABS_DELTA}")
    # Rows as half-open intervals of token slots (block * T + offset).
    read_start = sides[0][:, 0] * tokens_per_block + sides[0][:, 1]
    write_start = sides[-1][:, 0] * tokens_per_block + sides[-1][:, 1]
    order = np.argsort(write_start, kind="stable")
    ws, we = write_start[order], (write_start + n)[order]
    if (ws[1:] < we[:-1]).any():
        raise InvalidPlan("two plan rows write the same token slot")
    if copy:
        order = np.argsort(read_start, kind="stable")
        rs, reach = read_start[order], np.maximum.accumulate((read_start + n)[order])
        last_read_before_end = np.searchsorted(rs, we, side="left") - 1
        hit = last_read_before_end >= 0
        if (reach[last_read_before_end[hit]] > ws[hit]).any():
            raise InvalidPlan("a plan row writes a slot that another row reads (copy source and target overlap)")
