"""Diagnostic: the in-place default timed as a CUDA-graph replay (the benchmark's way) and as a plain launch, beside
the same-size copy (a plain launch, as the benchmark times it), all with triton's do_bench (L2 flushed before each
call; the 256 MB flush keeps the GPU busy while the host launches, so a plain launch's host cost stays hidden).

    python3 benchmarks/results/session20/launch_modes.py [ROUNDS]

Also a one-program kernel that does nothing, both ways: what a replay costs on the device beyond a launch.
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, "benchmarks")
from bench_rope_delta import MODELS, _graphed, case_default, kernel_fn, make_case

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


@triton.jit
def _nothing(x):
    pass


def bench(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=100)) * 1e3  # µs


scratch = torch.empty(1, device="cuda")
empty = lambda: _nothing[(1,)](scratch)  # noqa: E731
rows: dict[str, list[float]] = {"empty kernel, plain": [], "empty kernel, graph": []}
fns = {"empty kernel, plain": empty, "empty kernel, graph": _graphed(empty)}
for name in ("Qwen2.5-7B", "Llama-3-8B"):
    case = make_case(MODELS[name], 2048, "cuda", torch.bfloat16)
    kernel = kernel_fn(case, "inplace", case_default(case, "inplace"))
    src = torch.empty(case.k_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    fns[f"{name} copy, plain"] = lambda src=src, dst=dst: dst.copy_(src)
    fns[f"{name} kernel, graph"] = _graphed(kernel)
    fns[f"{name} kernel, plain"] = kernel
    for label in list(fns)[-3:]:
        rows[label] = []
for r in range(ROUNDS):
    for label in fns if r % 2 == 0 else list(fns)[::-1]:
        rows[label].append(bench(fns[label]))
med = {label: statistics.median(v) for label, v in rows.items()}
for label, v in rows.items():
    extra = ""
    name = label.split(" ")[0]
    if "kernel" in label and name in MODELS:
        extra = f"  {100 * med[f'{name} copy, plain'] / med[label]:.1f}% of copy"
    print(f"{label:28s} {med[label]:7.2f} µs (min {min(v):.2f} / max {max(v):.2f}){extra}")
