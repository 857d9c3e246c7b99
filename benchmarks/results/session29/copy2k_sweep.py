"""Session 29: bf16 copy at 2K (Qwen2.5-7B and Llama-3-8B), every setting of ``SIZE_SWEEP`` with this tree's kernels,
against session 28's default on session 28's kernels (``.stage/base/kernels``) and the same-size copy, ``do_bench``
medians of ROUNDS interleaved rounds; each setting checked against the torch reference first.

    python3 benchmarks/results/session29/copy2k_sweep.py [ROUNDS]
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "benchmarks")
import bench_rope_delta as bench

sys.path.insert(0, "benchmarks/results/session29")
from ab_defaults import launch


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    sys.path.insert(0, ".stage/base")
    import kernels.rope_delta as old

    for model in ("Qwen2.5-7B", "Llama-3-8B"):
        case = bench.make_case(bench.MODELS[model], 2048, "cuda", torch.bfloat16)
        graphs = {"base default": bench._graphed(launch(old, case, "copy")[0])}
        for t in bench.SIZE_SWEEP:
            if bench.check_matches_reference(case, "copy", t) > 0.0625:
                print(f"  {bench.short_name(t)}: wrong, left out")
                continue
            graphs[bench.short_name(t)] = bench._graphed(bench.kernel_fn(case, "copy", t))
        src = torch.empty(case.k_bytes, dtype=torch.bfloat16, device="cuda")
        copy = functools.partial(torch.empty_like(src).copy_, src)
        times: dict[str, list[float]] = {k: [] for k in (*graphs, "copy")}
        for r in range(rounds):
            for k in list(graphs) if r % 2 == 0 else list(graphs)[::-1]:
                times[k].append(float(do_bench(graphs[k], warmup=25, rep=100)))
            times["copy"].append(float(do_bench(copy, warmup=25, rep=100)))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"## bf16 {model} 2048 copy: same-size copy {med['copy']:.4f} ms")
        print("| setting | ms | % of copy |\n|---|---|---|")
        for k in sorted(graphs, key=lambda k: med[k]):
            print(f"| {k} | {med[k]:.4f} | {100 * med['copy'] / med[k]:.1f}% |", flush=True)
        del case, src, copy, graphs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
