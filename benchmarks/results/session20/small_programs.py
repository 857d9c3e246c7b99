"""Settings for bf16 in place at the 2K cases that no earlier sweep timed with the one-trip start: one head a program
at 4 and 8 warps (more programs resident, a shorter wave tail), with and without the L2 prefetch, beside the defaults.

    python3 benchmarks/results/session20/small_programs.py [ROUNDS]

Each setting is checked against the torch reference first, then all are timed in interleaved rounds (CUDA-graph
replays, L2 flushed, as `bench_rope_delta.py --cases`), and the same-size copy is timed in every round too; % of the
copy's median.
"""

from __future__ import annotations

import statistics
import sys

import torch
from semblend_kernels.rope_delta import KernelTuning

sys.path.insert(0, "benchmarks")
from bench_rope_delta import (
    MODELS,
    case_default,
    check_matches_reference,
    kernel_fn,
    make_case,
    short_name,
    time_ms,
)

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
ONE_TRIP = {"layers_per_program": 1, "layers_fastest": True, "one_trip_start": True}
SETTINGS = [
    KernelTuning(num_warps=8, heads_per_program=1, max_registers=None, **ONE_TRIP),
    KernelTuning(num_warps=8, heads_per_program=1, max_registers=None, l2_prefetch=True, **ONE_TRIP),
    KernelTuning(num_warps=8, heads_per_program=1, max_registers=40, **ONE_TRIP),
    KernelTuning(num_warps=4, heads_per_program=1, max_registers=None, **ONE_TRIP),
    KernelTuning(num_warps=16, heads_per_program=1, max_registers=40, **ONE_TRIP),
    KernelTuning(num_warps=8, heads_per_program=2, max_registers=None, **ONE_TRIP),
    KernelTuning(num_warps=8, heads_per_program=None, max_registers=None, **ONE_TRIP),
    KernelTuning(num_warps=8, heads_per_program=None, max_registers=None, l2_prefetch=True, **ONE_TRIP),
]

for name in ("Qwen2.5-7B", "Llama-3-8B"):
    case = make_case(MODELS[name], 2048, "cuda", torch.bfloat16)
    default = case_default(case, "inplace")
    settings = [default, *(t for t in SETTINGS if t != default)]
    errors = {t: check_matches_reference(case, "inplace", t) for t in settings}
    fns = {t: kernel_fn(case, "inplace", t) for t in settings}
    src = torch.empty(case.k_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    samples: dict[object, list[float]] = {t: [] for t in settings}
    samples["copy"] = []
    for r in range(ROUNDS):
        for t in settings if r % 2 == 0 else settings[::-1]:
            samples[t].append(time_ms(fns[t], True, graph=True, rep_ms=100))
        samples["copy"].append(time_ms(lambda src=src, dst=dst: dst.copy_(src), True, rep_ms=100))
    copy = statistics.median(samples["copy"])
    print(
        f"\n## bf16 {name} 2048 inplace: copy {copy:.4f} ms (min {min(samples['copy']):.4f} / max {max(samples['copy']):.4f})"
    )
    print("| setting | ms (median) | min / max | % of copy | max abs diff |")
    print("|---|---|---|---|---|")
    for t in sorted(settings, key=lambda t: statistics.median(samples[t])):
        v = samples[t]
        med = statistics.median(v)
        mark = " (default)" if t == default else ""
        print(
            f"| {short_name(t)}{mark} | {med:.4f} | {min(v):.4f} / {max(v):.4f} | {100 * copy / med:.1f}% | {errors[t]:g} |"
        )
