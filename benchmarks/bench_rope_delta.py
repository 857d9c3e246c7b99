"""RoPE-delta kernels vs the device's copy bandwidth and vs the torch reference, measured in one run.

    python benchmarks/bench_rope_delta.py [--out results.json]   # on a CUDA GPU (TRITON_INTERPRET unset or 0)
    TRITON_INTERPRET=1 python benchmarks/bench_rope_delta.py --smoke   # tiny shapes on CPU: checks the script runs
    python benchmarks/bench_rope_delta.py --sweep-every-size --out bench.json  # + every case's own sweep (SIZE_SWEEP)
    python benchmarks/pick_rope_defaults.py bench.json   # then: the library's default table from that sweep
    python benchmarks/bench_rope_delta.py --short --rounds 3 --out short.json  # the short cases x CASE_SWEEP only
    python benchmarks/bench_rope_delta.py --cases bf16:Qwen2.5-7B:2048:inplace --sweep session14  # SESSION14_SWEEP

Prints the measured device copy bandwidth (torch copy of a 4 GiB buffer, read + write bytes), a small tuning sweep,
then for Llama-3-8B and Qwen2.5-7B KV shapes (bf16 and fp8 e4m3 with per-layer scales, 32-token blocks) at 2K / 8K /
32K tokens, in place and copy+rotate: the kernel time (each (dtype, model)'s best setting from the sweep, and the
library default, ``default_tuning``) and GB/s (its bytes: K read + write in place; K and V read + write for copy),
its share of the 4 GiB copy's bandwidth and of a torch copy of the same number of bytes (in the same run: the ceiling
for a transfer of that size), the public call's time (plan validation included) and the torch reference's time and
the speedup over it. Every time is a mean with L2 flushed between calls. Kernel times are replays of CUDA graphs (a
busy host's launch cost would otherwise show up as GPU idle time in the 2K rows); the torch copies, the public call
and the reference are timed as called (a large ``copy_`` captured in a graph runs as a memcpy node, at about 2.7 TB/s
on the H200 instead of 4.2).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from semblend_kernels.layout import PagedKVLayout
from semblend_kernels.rope import RopeConfig
from semblend_kernels.rope_delta import (
    INPLACE_PLAN_COLUMNS,
    CopySpan,
    InplaceSpan,
    KernelTuning,
    default_tuning,
    rope_delta_copy,
    rope_delta_copy_reference,
    rope_delta_inplace,
    rope_delta_inplace_reference,
    split_inplace_spans_to_plan,
    split_spans_to_plan,
)
from semblend_kernels.rope_delta.launch import _launch_copy, _launch_inplace  # the validated launch alone, timed
from semblend_kernels.rope_delta.plan import check_plan

MODELS = {"Llama-3-8B": (32, 8, 128), "Qwen2.5-7B": (28, 4, 128)}
SMOKE_MODELS = {"tiny": (2, 2, 32)}
TOKENS_PER_BLOCK = 32
DELTA = 1234
UNALIGNED_SRC_START, UNALIGNED_DST_START = 5, 19
SWEEP = [
    KernelTuning(16, 2, 40),
    KernelTuning(16, 4, 40),
    KernelTuning(8, 2, None),
    KernelTuning(8, 4, None),
    KernelTuning(8, 8, None),
    KernelTuning(8, 4, 64),
    KernelTuning(4, 2, None),
]
"""warps / layers per program / register cap."""
LOAD_ALL_SIZE_SWEEP = [
    # one row group per program, all its (layer x head) tiles loaded before any store; tiles = layers x heads
    KernelTuning(4, 1, None, 2, load_all_tiles=True),
    KernelTuning(4, 1, None, 4, load_all_tiles=True),
    KernelTuning(8, 1, None, 2, load_all_tiles=True),
    KernelTuning(8, 1, None, load_all_tiles=True),
    KernelTuning(8, 2, None, 4, load_all_tiles=True),
    KernelTuning(16, 1, None, load_all_tiles=True),
]
"""Load-all-tiles programs (issue 16.4, session 9): 2, 4 or 8 tiles (all heads: Qwen2.5-7B 4, Llama-3-8B 8) at 4-16
warps, uncapped (sm_90a counts: benchmarks/results/kern5/registers_sm90a_tiles.md)."""
LAYERS_FASTEST_SIZE_SWEEP = [KernelTuning(16, lpp, 40, layers_fastest=True) for lpp in (1, 2)]
"""Layers-fastest program order (issue 16.4, session 10): the best two of the session-10 H200 short run, the first the
bf16 in-place default up to 8K tokens."""
ONE_TRIP_SIZE_SWEEP = [
    KernelTuning(16, 1, 40, layers_fastest=True, one_trip_start=True),
    KernelTuning(4, 1, None, 4, load_all_tiles=True, one_trip_start=True),
]
"""The one-trip start (issue 16.4, session 12): the session-12 H200 short run's bf16 in-place default and its fp8
in-place and fp8 copy (Qwen2.5-7B 2K) default."""
SIZE_SWEEP = [
    *(KernelTuning(16, lpp, 40) for lpp in (2, 4, 8)),
    KernelTuning(16, 4, 32),
    *(KernelTuning(8, 4, regs) for regs in (64, None)),
    *(KernelTuning(4, lpp, regs) for lpp, regs in ((2, None), (4, None), (2, 64), (4, 64))),
    *(KernelTuning(w, 8, regs, hpp) for w, regs, hpp in ((4, None, 2), (4, None, 4), (4, 64, 2), (8, None, 4))),
    *LOAD_ALL_SIZE_SWEEP,
    *LAYERS_FASTEST_SIZE_SWEEP,
    *ONE_TRIP_SIZE_SWEEP,
]
"""``--sweep-every-size``: every case gets its own sweep (small prompts want more, smaller programs: fewer layers or
heads per program). 24 settings: the 14 of the issue 16.4 final sweep that came within 2% of a case's best there,
`LOAD_ALL_SIZE_SWEEP`, `LAYERS_FASTEST_SIZE_SWEEP` and `ONE_TRIP_SIZE_SWEEP` (the persistent, pipelined and
two-heads-a-step settings swept with them until session 28 won nowhere and were removed from the kernels)."""
_BF16_DEFAULT = KernelTuning(16, 1, 40, layers_fastest=True)
_BF16_TILES = KernelTuning(4, 1, None, 2, load_all_tiles=True, layers_fastest=True)
_FP8_TILES = KernelTuning(4, 1, None, 4, load_all_tiles=True)
_FP8_GRID = KernelTuning(4, 2, 64)
CASE_SWEEP: dict[tuple[str, str], list[KernelTuning]] = {
    ("bf16", "inplace"): [
        # baselines: the session-10 H200 default and runners-up, and 2 heads per program without the new start
        _BF16_DEFAULT,
        KernelTuning(16, 2, 40, layers_fastest=True),
        replace(_BF16_DEFAULT, heads_per_program=2),
        _BF16_TILES,
        # one-trip start: the default, under a 32-register cap (4 programs of 16 warps per multiprocessor), with 2
        # heads per program (more, shorter programs: a shorter tail) and 2 layers per program; load-all-tiles
        replace(_BF16_DEFAULT, one_trip_start=True),
        replace(_BF16_DEFAULT, max_registers=32, one_trip_start=True),
        replace(_BF16_DEFAULT, heads_per_program=2, one_trip_start=True),
        KernelTuning(16, 2, 40, layers_fastest=True, one_trip_start=True),
        replace(_BF16_TILES, one_trip_start=True),
    ],
    ("fp8", "inplace"): [
        _FP8_TILES,
        _FP8_GRID,
        replace(_FP8_TILES, one_trip_start=True),
        replace(_FP8_GRID, one_trip_start=True),
    ],
    ("fp8", "copy"): [
        KernelTuning(4, 4, None),
        _FP8_TILES,
        replace(_FP8_TILES, one_trip_start=True),
    ],
}
"""``--cases`` / ``--short`` (issue 16.4, session 12): per (dtype, op), the session-10 H200 defaults and runners-up at
the short sizes, then the same settings with `KernelTuning.one_trip_start` (``+S``). (Session 10 timed layers-fastest
order, cache hints, unmasked full tiles and fp16 rotation for fp8 here: docs/benchmarks.md.)"""
_BF16_ONE_TRIP = replace(_BF16_DEFAULT, one_trip_start=True)
SESSION14_SWEEP: dict[tuple[str, str], list[KernelTuning]] = {
    ("bf16", "inplace"): [
        # baselines: the default (``w16l1r40+L+S``, all heads a program) and its two-heads-a-program twin
        _BF16_ONE_TRIP,
        replace(_BF16_ONE_TRIP, heads_per_program=2),
        # L2 bulk prefetch of the program's K first (+F): all heads, 2 heads (the first H200 call's best at Qwen 2K and
        # 8K), 1 head (more programs; the prefetch then only starts the program's own tile early)
        replace(_BF16_ONE_TRIP, l2_prefetch=True),
        replace(_BF16_ONE_TRIP, heads_per_program=2, l2_prefetch=True),
        replace(_BF16_ONE_TRIP, heads_per_program=1, l2_prefetch=True),
        # 2 heads at 8 warps (40 registers, 6 programs a multiprocessor; a cap of 32 spills), and 2 layers a program
        # (half the programs, two prefetches each) with 2 heads and with all heads
        replace(_BF16_ONE_TRIP, num_warps=8, heads_per_program=2, l2_prefetch=True),
        replace(_BF16_ONE_TRIP, layers_per_program=2, heads_per_program=2, l2_prefetch=True),
        replace(_BF16_ONE_TRIP, layers_per_program=2, l2_prefetch=True),
    ],
}
"""``--sweep session14`` (issue 16.4, session 14): bf16 in place, the default against `KernelTuning.l2_prefetch`
(``+F``) settings (the second H200 call; the first also timed TMA tiles, since removed: docs/benchmarks.md)."""
SWEEPS = {"session12": CASE_SWEEP, "session14": SESSION14_SWEEP}
SHORT_CASES = [
    "bf16:Llama-3-8B:2048:inplace",
    "bf16:Qwen2.5-7B:2048:inplace",
    "bf16:Qwen2.5-7B:8192:inplace",
    "fp8:Qwen2.5-7B:2048:inplace",
    "fp8:Llama-3-8B:2048:inplace",
    "fp8:Qwen2.5-7B:2048:copy",
]
"""``--short``: the shapes that missed issue 16.4's goals on the H200 in session 9 (and fp8 Llama 2K in place)."""
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
FP8_LAYER_SCALE = 0.05


def time_ms(fn: Callable[[], object], cuda: bool, graph: bool = False, rep_ms: int = 200) -> float:
    """Mean milliseconds per call: triton's do_bench on CUDA (L2 flushed between calls), a wall clock otherwise.

    ``graph``: time replays of a CUDA graph of ``fn``, so that the host's launch cost (which can exceed a 2K-token
    kernel's run time on a busy host) never shows up as GPU idle time inside the measurement.
    """
    if cuda:
        from triton.testing import do_bench

        return float(do_bench(_graphed(fn) if graph else fn, warmup=25, rep=rep_ms))
    fn()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    return (time.perf_counter() - start) / 3 * 1e3


def _graphed(fn: Callable[[], object]) -> Callable[[], None]:
    fn()  # compiles and warms up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def copy_bandwidth_gbps(device: str, nbytes: int, cuda: bool) -> float:
    """torch ``copy_`` of an ``nbytes`` buffer into another, counting read + write bytes."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), cuda)  # not graphed: a captured copy_ becomes a slower memcpy node
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9


@dataclass
class Case:
    layout: PagedKVLayout
    pool: torch.Tensor
    copy_plan: torch.Tensor
    inplace_plan: torch.Tensor
    inv_freq: torch.Tensor
    kv_scale: torch.Tensor | None  # fp8 only: per-layer dequantization scales
    k_bytes: int  # bytes of K (== of V) for all tokens and layers


def make_case(
    model: tuple[int, int, int], tokens: int, device: str, dtype: torch.dtype, unaligned: bool = False
) -> Case:
    layers, heads, head_dim = model
    layout = PagedKVLayout(layers, heads, head_dim, TOKENS_PER_BLOCK)
    n_blocks = -(-tokens // TOKENS_PER_BLOCK) + 1
    total = 2 * n_blocks + 8
    pool = torch.empty(total, layers, 2, layout.block_elems, dtype=torch.bfloat16, device=device).normal_()
    kv_scale = None
    if dtype == torch.float8_e4m3fn:
        pool = (pool * 20).to(dtype)
        kv_scale = torch.full((layers,), FP8_LAYER_SCALE, device=device)
    ids = torch.randperm(total, generator=torch.Generator().manual_seed(0))[: 2 * n_blocks].tolist()
    src_ids, dst_ids = ids[:n_blocks], ids[n_blocks:]
    src0, dst0 = (UNALIGNED_SRC_START, UNALIGNED_DST_START) if unaligned else (0, 0)
    copy_plan = split_spans_to_plan([CopySpan(src0, dst0, tokens, delta=DELTA)], src_ids, dst_ids, TOKENS_PER_BLOCK)
    inplace_plan = split_inplace_spans_to_plan([InplaceSpan(dst0, tokens, DELTA)], dst_ids, TOKENS_PER_BLOCK)
    inv_freq = RopeConfig(head_dim, head_dim, 500_000.0).inv_freq(device)
    k_bytes = tokens * layers * heads * head_dim * pool.element_size()
    return Case(layout, pool, copy_plan, inplace_plan, inv_freq, kv_scale, k_bytes)


def kernel_fn(case: Case, op: str, tuning: KernelTuning) -> Callable[[], object]:
    """The validated launch alone (plan already on the device); its call returns Triton's compiled kernel."""
    hd = case.layout.head_dim
    if op == "inplace":
        c = check_plan(
            case.pool,
            case.inplace_plan,
            case.inv_freq,
            case.layout,
            hd,
            "neox",
            None,
            INPLACE_PLAN_COLUMNS,
            case.kv_scale,
        )
        return lambda: _launch_inplace(case.pool, c, case.layout, hd, "neox", tuning)
    c = check_plan(case.pool, case.copy_plan, case.inv_freq, case.layout, hd, "neox", None, 6, case.kv_scale)
    return lambda: _launch_copy(case.pool, c, case.layout, hd, "neox", tuning)


def case_default(case: Case, op: str) -> KernelTuning:
    """The library's default launch for this case (what the public functions use without ``tuning=``)."""
    plan = case.inplace_plan if op == "inplace" else case.copy_plan
    c = check_plan(
        case.pool, plan, case.inv_freq, case.layout, case.layout.head_dim, "neox", None, plan.shape[1], case.kv_scale
    )
    return default_tuning(case.pool.dtype, op, c.groups.shape[0] * case.layout.num_layers * case.layout.num_kv_heads)  # type: ignore[arg-type]


def public_fn(case: Case, op: str, tuning: KernelTuning, reference: bool = False) -> Callable[[], None]:
    kw = {"rotary_dim": case.layout.head_dim, "kv_scale": case.kv_scale}
    if op == "inplace":
        plan = case.inplace_plan
        if reference:
            return lambda: rope_delta_inplace_reference(case.pool, plan, case.inv_freq, case.layout, **kw)
        return lambda: rope_delta_inplace(case.pool, plan, case.inv_freq, case.layout, **kw, tuning=tuning)
    plan = case.copy_plan
    if reference:
        return lambda: rope_delta_copy_reference(case.pool, plan, case.inv_freq, case.layout, **kw)
    return lambda: rope_delta_copy(case.pool, plan, case.inv_freq, case.layout, **kw, tuning=tuning)


def check_matches_reference(case: Case, op: str, tuning: KernelTuning) -> float:
    """Largest |kernel - reference| (storage units) after one call of ``op`` with ``tuning`` and one of the reference,
    from the same pool (a guard that the timed setting is right)."""
    kernel, expected = replace(case, pool=case.pool.clone()), replace(case, pool=case.pool.clone())
    public_fn(kernel, op, tuning)()
    public_fn(expected, op, tuning, reference=True)()
    # fp32 copies of a whole 32K pool would take tens of GB: a slice of blocks at a time
    chunks = zip(kernel.pool.split(64), expected.pool.split(64), strict=True)
    return max(float((a.float() - b.float()).abs().max()) for a, b in chunks)


def _sweep_text(times: dict[KernelTuning, float]) -> str:
    return " ".join(f"{short_name(t)}={ms:.4f}" for t, ms in times.items())


def _load_all_vs_rest(times: dict[KernelTuning, float]) -> str:
    """The best load-all-tiles setting of a case's sweep against the best of the others (negative: it is faster)."""
    tiles = {t: ms for t, ms in times.items() if t.load_all_tiles}
    rest = {t: ms for t, ms in times.items() if not t.load_all_tiles}
    if not tiles or not rest:
        return "not both swept"
    a, b = min(tiles, key=lambda t: tiles[t]), min(rest, key=lambda t: rest[t])
    return f"{short_name(a)}={tiles[a]:.4f} vs {short_name(b)}={rest[b]:.4f} ({100 * (tiles[a] / rest[b] - 1):+.1f}%)"


def short_name(t: KernelTuning) -> str:
    """The setting as the sweep lines print it (benchmarks/pick_rope_defaults.py reads it back): warps, layers per
    program, register cap, then ``p``: heads per program, ``a``: load all tiles, ``+L``: layers fastest, ``+S``:
    one-trip start, ``+F``: L2 prefetch. (Records before session 29 also name ``h``, heads per iteration, and ``b``,
    groups per program, both always 1 since; and ``s``/``q`` for persistent and pipelined programs, since removed.)"""
    heads = f"p{t.heads_per_program}" if t.heads_per_program else ""
    all_tiles = "a" if t.load_all_tiles else ""
    variants = ("+L" if t.layers_fastest else "") + ("+S" if t.one_trip_start else "")
    variants += "+F" if t.l2_prefetch else ""
    return f"w{t.num_warps}l{t.layers_per_program}r{t.max_registers or '-'}{heads}{all_tiles}{variants}"


def _is_variant(t: KernelTuning, sweep: str) -> bool:
    """A setting of the sweep's candidates (session 12: one-trip start; session 14: L2 prefetch), against the baselines
    without them."""
    return t.one_trip_start if sweep == "session12" else t.l2_prefetch


def _checked_settings(
    case: Case, op: str, settings: list[KernelTuning], default: KernelTuning
) -> dict[KernelTuning, float]:
    """Each setting's max |kernel - reference| after one call; a setting whose compile or call fails, or whose error
    is more than 4x the default's (at least 4 x 2**-8), is reported and left out (it is never timed)."""
    errors: dict[KernelTuning, float] = {}
    for t in settings:
        try:
            errors[t] = check_matches_reference(case, op, t)
        except Exception as e:  # a variant that does not compile or launch here: report it, time the rest
            print(f"# {short_name(t)}: failed ({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})")
    bound = 4 * max(errors.get(default, 0.0), 2**-8)
    for t, err in list(errors.items()):
        if t != default and err > bound:
            print(f"# {short_name(t)}: wrong (max |kernel - reference| {err:g} > {bound:g}), not timed")
            del errors[t]
    return errors


def _registers(case: Case, op: str, tuning: KernelTuning) -> str:
    """``registers/spills`` of the compiled kernel for this setting (one more launch), ``-`` where unknown (the
    interpreter)."""
    kernel = kernel_fn(case, op, tuning)()
    regs, spills = getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None)
    return "-" if regs is None else f"{regs}/{spills}"


def run_cases(
    spec: list[str],
    rounds: int,
    cuda: bool,
    device: str,
    smoke: bool,
    sweep: str = "session12",
    only: set[str] | None = None,
) -> list[dict[str, object]]:
    """Each ``dtype:model:tokens:op`` case: the library default and its ``SWEEPS[sweep]`` settings (``only``: those
    of these names), timed ``rounds`` times each in interleaved order (median kept), every setting checked against
    the reference first (`_checked_settings`); then % of a same-size copy per setting with its compiled register
    count, and the best candidate setting against the best baseline of the same run."""
    models = SMOKE_MODELS if smoke else MODELS
    rows = []
    for item in spec:
        dname, name, tokens_text, op = item.split(":")
        if smoke:
            name, tokens_text = "tiny", "64"
        case = make_case(models[name], int(tokens_text), device, DTYPES[dname])
        default = case_default(case, op)
        candidates = [t for t in SWEEPS[sweep][dname, op] if only is None or short_name(t) in only]
        errors = _checked_settings(case, op, [default, *(t for t in candidates if t != default)], default)
        settings = list(errors)
        if default not in errors:
            print(f"\n## {dname} {name} {tokens_text} {op}: the default failed its check; case skipped")
            continue
        registers = {t: _registers(case, op, t) for t in settings}
        fns = {t: kernel_fn(case, op, t) for t in settings}
        samples: dict[KernelTuning, list[float]] = {t: [] for t in settings}
        for r in range(rounds):
            for t in settings if r % 2 == 0 else settings[::-1]:
                samples[t].append(time_ms(fns[t], cuda, graph=True, rep_ms=100))
        times = {t: statistics.median(v) for t, v in samples.items()}
        nbytes = case.k_bytes * (2 if op == "inplace" else 4)
        same_size_gbps = copy_bandwidth_gbps(device, nbytes // 2, cuda)
        copy_ms = nbytes / (same_size_gbps * 1e9) * 1e3
        label = f"{dname} {name} {tokens_text} {op}"
        print(
            f"\n## {label}: same-size copy {same_size_gbps:.0f} GB/s ({copy_ms:.4f} ms); default {short_name(default)}"
        )
        print(
            "| setting | ms (median) | min / max | % of same-size copy | max abs diff vs reference | registers/spills |"
        )
        print("|---|---|---|---|---|---|")
        for t in sorted(settings, key=lambda t: times[t]):
            v = samples[t]
            print(
                f"| {short_name(t)}{' (default)' if t == default else ''} | {times[t]:.4f} | {min(v):.4f} / "
                f"{max(v):.4f} | {100 * copy_ms / times[t]:.1f}% | {errors[t]:g} | {registers[t]} |"
            )
        new = {t: ms for t, ms in times.items() if _is_variant(t, sweep)}
        old = {t: ms for t, ms in times.items() if not _is_variant(t, sweep)}
        best = min(times, key=lambda t: times[t])
        summary = (
            f"{sweep} {label}: best {short_name(best)}={times[best]:.4f} ({100 * copy_ms / times[best]:.1f}%); "
            f"default {short_name(default)}={times[default]:.4f} ({100 * copy_ms / times[default]:.1f}%)"
        )
        if new and old:
            a, b = min(new, key=lambda t: new[t]), min(old, key=lambda t: old[t])
            summary += (
                f"; best candidate {short_name(a)} ({100 * copy_ms / new[a]:.1f}%) vs best baseline {short_name(b)} "
                f"({100 * copy_ms / old[b]:.1f}%) ({100 * (new[a] / old[b] - 1):+.1f}%)"
            )
        print(summary)
        rows.append(
            {
                "case": item,
                "same_size_copy_gbps": same_size_gbps,
                "same_size_copy_ms": copy_ms,
                "default": short_name(default),
                "settings": {
                    short_name(t): {
                        "ms": times[t],
                        "samples": samples[t],
                        "max_abs_diff_vs_reference": errors[t],
                        "registers_spills": registers[t],
                    }
                    for t in settings
                },
            }
        )
        del case, fns
        if cuda:
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, runs anywhere (checks the script)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--sweep-every-size", action="store_true", help="sweep launch settings for every case, not one per model"
    )
    parser.add_argument(
        "--cases",
        help="only these cases, comma-separated dtype:model:tokens:op (e.g. bf16:Qwen2.5-7B:2048:inplace), each "
        "with the default and CASE_SWEEP; no per-model sweep, no table",
    )
    parser.add_argument("--short", action="store_true", help="--cases with SHORT_CASES (the session-9 misses)")
    parser.add_argument("--rounds", type=int, default=3, help="--cases: interleaved timings per setting (median)")
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default="session12", help="--cases: which settings")
    parser.add_argument(
        "--settings", help="--cases: only these settings of the sweep (comma-separated names as printed; default kept)"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    device = "cuda" if cuda else "cpu"
    if args.cases or args.short:
        spec = args.cases.split(",") if args.cases else SHORT_CASES
        hardware = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
        print(f"# hardware: {hardware}; torch {torch.__version__}; cases {spec}; rounds {args.rounds}")
        only = set(args.settings.split(",")) if args.settings else None
        rows = run_cases(spec, args.rounds, cuda, device, args.smoke, args.sweep, only)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"hardware": hardware, "torch": torch.__version__, "cases": rows}, f, indent=2)
        return 0
    models = SMOKE_MODELS if args.smoke else MODELS
    token_counts = (64,) if args.smoke else (2048, 8192, 32768)
    hardware = torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine()
    print(f"# hardware: {hardware}; torch {torch.__version__}")
    results: dict[str, object] = {"hardware": hardware, "torch": torch.__version__}

    copy_gbps = copy_bandwidth_gbps(device, (4 << 30) if cuda else (64 << 20), cuda)
    print(f"device copy bandwidth (torch copy_, read+write bytes): {copy_gbps:.0f} GB/s")
    results["copy_gbps"] = copy_gbps

    # Tuning sweep per (dtype, model) at the middle token count; the table uses each one's best per op.
    best: dict[tuple[str, str, str], KernelTuning] = {}
    sweep_rows = []
    for dname, dtype in DTYPES.items():
        for name, model in models.items():
            sweep_case = make_case(model, token_counts[len(token_counts) // 2], device, dtype)
            for op in ("inplace", "copy"):
                times = {
                    t: time_ms(kernel_fn(sweep_case, op, t), cuda, graph=True) for t in (SWEEP if cuda else SWEEP[:2])
                }
                best[dname, name, op] = min(times, key=lambda t: times[t])
                for t, ms in times.items():
                    sweep_rows.append({"dtype": dname, "model": name, "op": op, **vars(t), "ms": ms})
                print(
                    f"tuning sweep {dname} {name} {op} (heads/warps/layers/blocks/registers=ms): {_sweep_text(times)}"
                )
                print(f"  best {dname} {name} {op}: {best[dname, name, op]}")
            del sweep_case
    results["sweep"] = sweep_rows

    print(
        "\n| dtype | model | tokens | op | kernel ms | GB/s | % of 4 GiB copy | same-size copy GB/s | % of same-size copy "
        "| default ms | default % of same-size copy | call ms | torch ref ms | speedup kernel | speedup call |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = []
    first = next(iter(models))
    cases = [(dname, name, tokens, False) for dname in DTYPES for name in models for tokens in token_counts] + [
        (dname, first, token_counts[len(token_counts) // 2], True) for dname in DTYPES
    ]
    for dname, name, tokens, unaligned in cases:
        case = make_case(models[name], tokens, device, DTYPES[dname], unaligned)
        for op in ("inplace", "copy"):
            tuning = best[dname, name, op]
            default = case_default(case, op)
            default_ms = time_ms(kernel_fn(case, op, default), cuda, graph=True)
            times = {}
            if args.sweep_every_size:
                settings = SIZE_SWEEP if cuda else SWEEP[::4] + LOAD_ALL_SIZE_SWEEP
                times = {t: time_ms(kernel_fn(case, op, t), cuda, graph=True, rep_ms=100) for t in settings}
                tuning = min(times, key=lambda t: times[t])
                print(f"  sweep {dname} {name} {tokens} {op}: best {short_name(tuning)}; {_sweep_text(times)}")
                print(f"  load-all-tiles {dname} {name} {tokens} {op}: {_load_all_vs_rest(times)}")
            max_err = check_matches_reference(case, op, tuning)
            print(f"  check {dname} {name} {tokens} {op} {short_name(tuning)}: max |kernel - reference| {max_err:g}")
            kernel_ms = time_ms(kernel_fn(case, op, tuning), cuda, graph=True)
            call_ms = time_ms(public_fn(case, op, tuning), cuda)
            ref_ms = time_ms(public_fn(case, op, tuning, reference=True), cuda)
            nbytes = case.k_bytes * (2 if op == "inplace" else 4)
            same_size_gbps = copy_bandwidth_gbps(device, nbytes // 2, cuda)
            gbps = nbytes / (kernel_ms * 1e-3) / 1e9
            label = f"{tokens}{' (unaligned spans)' if unaligned else ''}"
            row = {
                "dtype": dname,
                "model": name,
                "tokens": tokens,
                "unaligned": unaligned,
                "op": op,
                "kernel_ms": kernel_ms,
                "tuning": vars(tuning),
                "default_tuning": vars(default),
                "default_tuning_ms": default_ms,
                "default_fraction_of_same_size_copy": nbytes / (default_ms * 1e-3) / 1e9 / same_size_gbps,
                "gbps": gbps,
                "fraction_of_copy_bw": gbps / copy_gbps,
                "same_size_copy_gbps": same_size_gbps,
                "fraction_of_same_size_copy": gbps / same_size_gbps,
                "call_ms": call_ms,
                "reference_ms": ref_ms,
                "speedup_kernel_vs_reference": ref_ms / kernel_ms,
                "speedup_call_vs_reference": ref_ms / call_ms,
                "max_abs_diff_vs_reference": max_err,
                "size_sweep": {short_name(t): ms for t, ms in times.items()},
            }
            rows.append(row)
            print(
                f"| {dname} | {name} | {label} | {op} | {kernel_ms:.3f} | {gbps:.0f} | {100 * gbps / copy_gbps:.0f}% | "
                f"{same_size_gbps:.0f} | {100 * gbps / same_size_gbps:.0f}% | {default_ms:.3f} | "
                f"{100 * nbytes / (default_ms * 1e-3) / 1e9 / same_size_gbps:.0f}% | {call_ms:.3f} | {ref_ms:.3f} | {ref_ms / kernel_ms:.1f}x | {ref_ms / call_ms:.1f}x |"
            )
        del case
        if cuda:
            torch.cuda.empty_cache()
    results["rows"] = rows
    results["best_tuning"] = {f"{dname}/{name}/{op}": vars(t) for (dname, name, op), t in best.items()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
