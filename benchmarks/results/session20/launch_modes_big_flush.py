"""Diagnostic: the in-place default as a plain launch and as a CUDA-graph replay, and the same-size copy, each after a
1 GiB L2 flush (long enough, ~300 µs, that the host's launch of a plain call is always done before the GPU reaches
it), timed by CUDA events around the call alone; and a one-program kernel that does nothing, both ways.

    python3 benchmarks/results/session20/launch_modes_big_flush.py [ROUNDS] [REPS]
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton

sys.path.insert(0, "benchmarks")
from bench_rope_delta import MODELS, _graphed, case_default, kernel_fn, make_case

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100
flush = torch.empty(1 << 30, dtype=torch.int8, device="cuda")


@triton.jit
def _nothing(x):
    pass


def timed(fn) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for i in range(REPS):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.mean(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) * 1e3  # µs


scratch = torch.empty(1, device="cuda")
empty = lambda: _nothing[(1,)](scratch)  # noqa: E731
fns = {"empty kernel, plain": empty, "empty kernel, graph": _graphed(empty)}
for name in ("Qwen2.5-7B", "Llama-3-8B"):
    case = make_case(MODELS[name], 2048, "cuda", torch.bfloat16)
    kernel = kernel_fn(case, "inplace", case_default(case, "inplace"))
    src = torch.empty(case.k_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    fns[f"{name} copy, plain"] = lambda src=src, dst=dst: dst.copy_(src)
    fns[f"{name} kernel, graph"] = _graphed(kernel)
    fns[f"{name} kernel, plain"] = kernel
rows: dict[str, list[float]] = {label: [] for label in fns}
for r in range(ROUNDS):
    for label in fns if r % 2 == 0 else list(fns)[::-1]:
        rows[label].append(timed(fns[label]))
med = {label: statistics.median(v) for label, v in rows.items()}
for label, v in rows.items():
    extra = ""
    name = label.split(" ")[0]
    if "kernel" in label and name in MODELS:
        extra = f"  {100 * med[f'{name} copy, plain'] / med[label]:.1f}% of copy"
    print(f"{label:28s} {med[label]:7.2f} µs (min {min(v):.2f} / max {max(v):.2f}){extra}")
