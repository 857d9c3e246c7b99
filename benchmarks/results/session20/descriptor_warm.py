"""Diagnostic: how much of the in-place kernel's gap to a same-size copy is its first dependent trip (the row-group
descriptors and inverse frequencies, read from DRAM after the L2 flush before the first data load).

    python3 benchmarks/results/session20/descriptor_warm.py [ROUNDS] [REPS]

Per case and round, REPS calls of each: the kernel (default tuning, a CUDA-graph replay) with the descriptors cold (the
L2 flushed, then two tiny copies of unrelated tensors), the same with them warm (flushed, then the descriptors and
inverse frequencies copied into scratch, which leaves them in L2), and the torch ``copy_`` of a K-sized buffer after
the same flush and tiny copies. Prints medians of the per-round means and % of the copy.
"""

from __future__ import annotations

import statistics
import sys

import torch
from semblend_kernels.rope_delta import INPLACE_PLAN_COLUMNS, _check, _launch_inplace

sys.path.insert(0, "benchmarks")
from bench_rope_delta import MODELS, _graphed, case_default, make_case

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")


def timed(fn, before) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for i in range(REPS):
        flush.zero_()
        before()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.mean(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3  # µs


for name in ("Qwen2.5-7B", "Llama-3-8B"):
    case = make_case(MODELS[name], 2048, "cuda", torch.bfloat16)
    hd = case.layout.head_dim
    c = _check(case.pool, case.inplace_plan, case.inv_freq, case.layout, hd, "neox", None, INPLACE_PLAN_COLUMNS, None)
    tune = case_default(case, "inplace")
    kernel = _graphed(
        lambda c=c, case=case, tune=tune, hd=hd: _launch_inplace(case.pool, c, case.layout, hd, "neox", tune)
    )
    src = torch.empty(case.k_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    g_scratch, f_scratch = torch.empty_like(c.groups), torch.empty_like(c.inv_freq)
    g_other, f_other = torch.zeros_like(c.groups), torch.zeros_like(c.inv_freq)

    def cold(gs=g_scratch, fs=f_scratch, go=g_other, fo=f_other) -> None:
        gs.copy_(go)
        fs.copy_(fo)

    def warm(gs=g_scratch, fs=f_scratch, c=c) -> None:
        gs.copy_(c.groups)
        fs.copy_(c.inv_freq)

    rows: dict[str, list[float]] = {"copy": [], "kernel cold": [], "kernel warm": []}
    for _ in range(ROUNDS):
        rows["copy"].append(timed(lambda src=src, dst=dst: dst.copy_(src), cold))
        rows["kernel cold"].append(timed(kernel, cold))
        rows["kernel warm"].append(timed(kernel, warm))
    copy = statistics.median(rows["copy"])
    print(f"{name} 2K bf16 in place, {c.groups.shape[0]} row groups, default {tune}")
    for label, values in rows.items():
        med = statistics.median(values)
        print(
            f"  {label:12s} {med:7.2f} µs (min {min(values):.2f} / max {max(values):.2f})  {100 * copy / med:5.1f}% of copy"
        )
