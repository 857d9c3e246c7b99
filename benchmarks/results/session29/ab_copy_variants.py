"""Session 29: the copy grid kernel's start, three ways, at the cases where it is the default (bf16 copy 2K / 8K, fp8
copy Llama-3-8B 2K / Qwen2.5-7B 8K): session 28's kernels (``.stage/base/kernels``), this tree's, and this tree's
with the delta read on its own before the group's other columns (``.stage/varB/kernels``, the order session 28's
loop had). Same bytes checked against session 28's; ``do_bench`` medians of ROUNDS interleaved rounds.

    python3 benchmarks/results/session29/ab_copy_variants.py [ROUNDS]
"""

from __future__ import annotations

import functools
import importlib.util
import statistics
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "benchmarks")
import bench_rope_delta as bench
from semblend_kernels import rope_delta as new

sys.path.insert(0, "benchmarks/results/session29")
from ab_defaults import launch


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[path.rsplit("/", 1)[0]])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    sys.path.insert(0, ".stage/base")
    import kernels.rope_delta as old

    load("varb_kernels", ".stage/varB/kernels/__init__.py")
    var_b = importlib.import_module("varb_kernels.rope_delta")
    trees = {"base": old, "this": new, "varB": var_b}
    print("| case | " + " | ".join(f"{k} ms" for k in trees) + " | copy ms | same bytes |")
    print("|---|" + "---|" * (len(trees) + 2))
    cases = [
        ("bf16", "Qwen2.5-7B", 2048),
        ("bf16", "Llama-3-8B", 2048),
        ("bf16", "Qwen2.5-7B", 8192),
        ("bf16", "Llama-3-8B", 8192),
        ("fp8", "Llama-3-8B", 2048),
        ("fp8", "Qwen2.5-7B", 8192),
    ]
    for dname, model, tokens in cases:
        case = bench.make_case(bench.MODELS[model], tokens, "cuda", bench.DTYPES[dname])
        fns = {k: launch(m, case, "copy")[0] for k, m in trees.items()}
        outs = {}
        for k, f in fns.items():
            pool = case.pool.clone()
            f(pool)
            outs[k] = pool
        same = all(torch.equal(outs["base"].view(torch.uint8), v.view(torch.uint8)) for v in outs.values())
        del outs
        src = torch.empty(case.k_bytes, dtype=torch.bfloat16, device="cuda")
        copy = functools.partial(torch.empty_like(src).copy_, src)
        graphs = {k: bench._graphed(f) for k, f in fns.items()}
        times: dict[str, list[float]] = {k: [] for k in (*trees, "copy")}
        for r in range(rounds):
            names = list(graphs) if r % 2 == 0 else list(graphs)[::-1]
            for k in names:
                times[k].append(float(do_bench(graphs[k], warmup=25, rep=100)))
            times["copy"].append(float(do_bench(copy, warmup=25, rep=100)))
        med = {k: statistics.median(v) for k, v in times.items()}
        cells = " | ".join(f"{med[k]:.4f} ({100 * med['copy'] / med[k]:.1f}%)" for k in trees)
        print(f"| {dname} {model} {tokens} copy | {cells} | {med['copy']:.4f} | {same} |", flush=True)
        del case, src, copy, graphs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
