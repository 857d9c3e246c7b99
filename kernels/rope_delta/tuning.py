"""Launch parameters of the RoPE-delta kernels, and the default for each dtype, operation and size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..layout import FP8_KV_DTYPE


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
    by layouts it does not fit, see `launch._prefetch_step`): the program first asks L2 for every K byte it will rotate, one
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
