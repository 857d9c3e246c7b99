"""Session 29: the kernels without the never-default program shapes against the kernels before (session 28's), per
benchmarked case, on one GPU: their outputs compared byte for byte, and each default timed beside the other.

    python3 benchmarks/results/session29/ab_defaults.py [ROUNDS]   # from the repository root, on a CUDA GPU

The tree before is imported from ``.stage/base/kernels`` (a copy of session 28's ``kernels/``). For every case of
``bench_rope_delta.py`` (bf16 and fp8; Qwen2.5-7B and Llama-3-8B; 2K, 8K and 32K tokens; in place and copy) both
trees' default launches are run on clones of one pool and must write the same bytes; then the two launches (CUDA-graph
replays) and a same-size ``copy_`` are timed with ``do_bench`` in ROUNDS interleaved rounds (default 5), the order of
the trees reversed every other round. Prints, per case, the medians in ms, the new tree's time over the old one's,
and each tree's % of the same-size copy.
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_rope_delta as bench
from semblend_kernels import rope_delta as new

sys.path.insert(0, ".stage/base")
import kernels.rope_delta as old


def launch(mod, case, op):
    """``mod``'s default launch for ``case`` (session 28's flat module, or this tree's package, whose steps live in
    its ``plan`` and ``launch`` modules since session 29's split)."""
    check = getattr(mod, "_check", None) or mod.plan.check_plan
    launcher = mod if hasattr(mod, "_launch_copy") else mod.launch
    plan = case.inplace_plan if op == "inplace" else case.copy_plan
    hd = case.layout.head_dim
    c = check(case.pool, plan, case.inv_freq, case.layout, hd, "neox", None, plan.shape[1], case.kv_scale)
    blocks = c.groups.shape[0] * case.layout.num_layers * case.layout.num_kv_heads
    tune = mod.default_tuning(case.pool.dtype, op, blocks)
    run = launcher._launch_inplace if op == "inplace" else launcher._launch_copy
    return (lambda pool=None: run(case.pool if pool is None else pool, c, case.layout, hd, "neox", tune)), tune


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    import triton

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    print(
        "| case | old default | new default | old ms | new ms | new / old | old % of copy | new % of copy | same bytes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for dname in ("bf16", "fp8"):
        for model in ("Qwen2.5-7B", "Llama-3-8B"):
            for tokens in (2048, 8192, 32768):
                case = bench.make_case(bench.MODELS[model], tokens, "cuda", bench.DTYPES[dname])
                for op in ("inplace", "copy"):
                    f_old, t_old = launch(old, case, op)
                    f_new, t_new = launch(new, case, op)
                    a, b = case.pool.clone(), case.pool.clone()
                    f_old(a)
                    f_new(b)
                    torch.cuda.synchronize()
                    same = bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))
                    del a, b
                    nbytes = case.k_bytes * (2 if op == "inplace" else 4)
                    src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
                    copy = functools.partial(torch.empty_like(src).copy_, src)
                    g_old, g_new = bench._graphed(f_old), bench._graphed(f_new)
                    times: dict[str, list[float]] = {"old": [], "new": [], "copy": []}
                    from triton.testing import do_bench

                    for r in range(rounds):
                        order = [("old", g_old), ("new", g_new)]
                        for name, fn in order if r % 2 == 0 else order[::-1]:
                            times[name].append(float(do_bench(fn, warmup=25, rep=100)))
                        times["copy"].append(float(do_bench(copy, warmup=25, rep=100)))
                    o, n, cp = (statistics.median(times[k]) for k in ("old", "new", "copy"))
                    print(
                        f"| {dname} {model} {tokens} {op} | {bench.short_name(t_old)} | {bench.short_name(t_new)} "
                        f"| {o:.4f} | {n:.4f} | {n / o:.3f} | {100 * cp / o:.1f}% | {100 * cp / n:.1f}% | {same} |",
                        flush=True,
                    )
                    del src, copy, g_old, g_new
                del case
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
