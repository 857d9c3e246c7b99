#!/usr/bin/env python3
"""Donor search latency and recall@8 at 10K / 100K / 1M donors while donors are being deleted.

Data: clustered synthetic 384-d unit vectors (1000-component Gaussian mixture in a 48-d latent space, random linear
map to 384-d, 5% isotropic noise), which resembles real MiniLM embeddings far more than i.i.d. Gaussians do.
For every query the benchmark first churns the index (deletes one random donor, inserts a fresh one, and before
every 10th query deletes that query's current true top-1), then searches. The baseline is exact numpy brute force
(``DonorIndex`` with the numpy backend) fed the same operations in the same run; its answers are the ground truth.
``--dtypes f16,i8`` builds one usearch index per vector storage and feeds them the same operations (an A/B in one run).
Besides recall@8 it reports near-recall@8: the share of hits whose exact cosine is within ``NEAR`` of the true 8th best
(a hit swapped with a near-tie counts), which separates quantization's reordering of near-ties from missed neighbours.

Every timed search also records whether a garbage-collector pass ran inside it (``gc.callbacks``), which is how the
1M tail was traced to full collections over per-donor Python objects. ``--legacy-gc-load N`` adds N tracked objects
per donor (what the index held before it switched to flat maps) so the same run shows the tail with and without them.

Usage: .venv/bin/python benchmarks/bench_donor_search.py [--sizes 10000,100000,1000000] [--ef 64,128] [--dtypes f16,i8]
"""

from __future__ import annotations

import argparse
import gc
import platform
import time
from typing import cast, get_args

import numpy as np

from semblend_dynamo.config import IndexBackend
from semblend_dynamo.donor_index import DonorIndex, VectorDtype

DIM, K, NS = 384, 8, "bench-namespace"
NEAR = 0.002  # near-recall: a hit counts when its exact cosine is within this of the true k-th best


def clustered(n: int, rng: np.random.Generator, centers: np.ndarray, proj: np.ndarray) -> np.ndarray:
    comp = rng.integers(0, len(centers), n)
    latent = centers[comp] + 0.35 * rng.standard_normal((n, centers.shape[1])).astype(np.float32)
    x = latent @ proj
    x += (
        0.05
        * np.linalg.norm(x, axis=1, keepdims=True)
        / np.sqrt(DIM)
        * rng.standard_normal((n, DIM)).astype(np.float32)
    )
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class GcWatch:
    """Counts garbage-collector passes and their duration while installed."""

    def __init__(self) -> None:
        self.passes = 0
        self.full_passes = 0
        self.seconds = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.passes += 1
            self.full_passes += info["generation"] == 2
            self.seconds += time.perf_counter() - self._t0


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def run_size(
    n: int,
    efs: list[int],
    n_queries: int,
    expansion_add: int,
    seed: int,
    legacy_gc_load: int = 0,
    dtypes: tuple[VectorDtype, ...] = ("f16",),
    connectivity: int = 16,
) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((1000, 48)).astype(np.float32)
    proj = rng.standard_normal((48, DIM)).astype(np.float32)
    data = clustered(n, rng, centers, proj)
    ids = [f"d{i}" for i in range(n)]
    capacity = n + n_queries + 16

    exact = DonorIndex(DIM, capacity, IndexBackend.NUMPY)
    exact.insert_batch(ids, NS, data)
    anns: dict[VectorDtype, DonorIndex] = {}
    build_s: dict[str, float] = {}
    for dtype in dtypes:
        t0 = time.perf_counter()
        ann = DonorIndex(
            DIM,
            capacity,
            IndexBackend.USEARCH,
            expansion_add=expansion_add,
            expansion_search=efs[0],
            connectivity=connectivity,
            dtype=dtype,
        )
        for start in range(0, n, 100_000):  # chunks keep peak memory of the f32 conversion low
            ann.insert_batch(ids[start : start + 100_000], NS, data[start : start + 100_000])
        anns[dtype] = ann
        build_s[dtype] = time.perf_counter() - t0
        print(
            f"  N={n:,}: usearch {dtype} HNSW build {build_s[dtype]:.1f} s (M={connectivity}, efC={expansion_add})",
            flush=True,
        )
    ballast = [tuple([i, i]) for i in range(n * legacy_gc_load)]  # tracked objects, as (namespace, key) tuples were

    queries = clustered(n_queries, rng, centers, proj)
    fresh = clustered(n_queries, rng, centers, proj)
    rows: list[dict[str, object]] = []
    alive = list(ids)
    for ef in efs:
        for ann in anns.values():
            for part in ann._partitions.values():  # benchmark-only knob: switch ef without a rebuild
                part._index.expansion_search = ef  # type: ignore[attr-defined]
        indexes = [exact, *anns.values()]
        for q in queries[:20]:  # warm-up, not recorded
            for index in indexes:
                index.search(NS, q, K)
        t_exact: list[float] = []
        t_ann: dict[str, list[float]] = {dtype: [] for dtype in anns}
        gc_hit_ann = dict.fromkeys(anns, 0)
        recall = dict.fromkeys(anns, 0.0)
        near = dict.fromkeys(anns, 0.0)
        leaked = dict.fromkeys(anns, 0)
        sim_err = dict.fromkeys(anns, 0.0)
        watch = GcWatch()
        gc.callbacks.append(watch)
        deleted_top1 = 0
        deleted: set[str] = set()
        for qi, q in enumerate(queries):
            # churn: delete a random resident donor, insert a new one
            victim = alive.pop(int(rng.integers(len(alive))))
            for index in indexes:
                index.delete(victim)
            deleted.add(victim)
            new_id = f"new-ef{ef}-{qi}"
            for index in indexes:
                index.insert(new_id, NS, fresh[qi])
            alive.append(new_id)
            if qi % 10 == 0:  # delete the query's current true top-1: it must never come back
                top1 = exact.search(NS, q, 1)[0].donor_id
                for index in indexes:
                    index.delete(top1)
                alive.remove(top1)
                deleted.add(top1)
                deleted_top1 += 1
            s = time.perf_counter_ns()
            truth = exact.search(NS, q, K)
            t_exact.append((time.perf_counter_ns() - s) / 1e6)
            order = list(anns) if qi % 2 == 0 else list(reversed(anns))  # neither storage always searches first
            for dtype in order:
                before = watch.passes
                s = time.perf_counter_ns()
                got = anns[dtype].search(NS, q, K)
                t_ann[dtype].append((time.perf_counter_ns() - s) / 1e6)
                gc_hit_ann[dtype] += watch.passes > before
                recall[dtype] += len({h.donor_id for h in got} & {h.donor_id for h in truth}) / K
                leaked[dtype] += sum(h.donor_id in deleted for h in got)
                for h in got:
                    stored = exact.vector(h.donor_id)
                    if stored is not None:
                        sim_err[dtype] = max(sim_err[dtype], abs(h.similarity - float(stored @ q)))
                        near[dtype] += (float(stored @ q) >= truth[-1].similarity - NEAR) / K
        gc.callbacks.remove(watch)
        for dtype in anns:
            rows.append(
                {
                    "n": n,
                    "dtype": dtype,
                    "ef": ef,
                    "legacy_gc_load": legacy_gc_load,
                    "gc_hit_ann": gc_hit_ann[dtype],
                    "gc_full_passes": watch.full_passes,
                    "gc_ms": watch.seconds * 1e3,
                    "ann_p50": pct(t_ann[dtype], 50),
                    "ann_p99": pct(t_ann[dtype], 99),
                    "exact_p50": pct(t_exact, 50),
                    "exact_p99": pct(t_exact, 99),
                    "recall": recall[dtype] / n_queries,
                    "near_recall": near[dtype] / n_queries,
                    "sim_err": sim_err[dtype],
                    "leaked": leaked[dtype],
                    "deletes": len(deleted),
                    "deleted_top1": deleted_top1,
                    "build_s": build_s[dtype],
                }
            )
            r = rows[-1]
            print(
                f"  N={n:,} {dtype} ef={ef}: usearch p50 {r['ann_p50']:.3f} ms p99 {r['ann_p99']:.3f} ms recall@8 "
                f"{r['recall']:.4f} near-recall@8 {r['near_recall']:.4f} max |similarity error| {r['sim_err']:.4f} | numpy exact p50 "
                f"{r['exact_p50']:.3f} ms p99 {r['exact_p99']:.3f} ms | deleted {len(deleted)} (leaked "
                f"{r['leaked']}) | gc passes inside ANN searches {r['gc_hit_ann']}, full passes "
                f"{watch.full_passes}, gc total {watch.seconds * 1e3:.1f} ms",
                flush=True,
            )
    del ballast
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--sizes", default="10000,100000", help="comma-separated donor counts (add 1000000)")
    parser.add_argument("--ef", default="64,128", help="comma-separated HNSW search expansions to measure")
    parser.add_argument("--queries", type=int, default=1000, help="queries per size and ef (<=300 at 1M)")
    parser.add_argument("--expansion-add", type=int, default=128, help="HNSW efConstruction")
    parser.add_argument(
        "--dtypes", default="f16", help="comma-separated usearch vector storages, A/B in one run: f16,i8"
    )
    parser.add_argument("--connectivity", type=int, default=16, help="HNSW M")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--legacy-gc-load",
        type=int,
        default=0,
        help="also run each size with this many extra GC-tracked objects per donor (the old index's tuples): 1",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    efs = [int(e) for e in args.ef.split(",")]
    dtypes = cast(tuple[VectorDtype, ...], tuple(args.dtypes.split(",")))
    if not set(dtypes) <= set(get_args(VectorDtype)):
        parser.error(f"--dtypes {args.dtypes!r}: each must be one of {', '.join(get_args(VectorDtype))}")
    print(f"# donor search, {platform.processor() or platform.machine()}, {__import__('os').cpu_count()} CPUs")
    rows = []
    for n in sizes:
        n_queries = min(args.queries, 300) if n >= 1_000_000 else args.queries
        for load in (0, args.legacy_gc_load) if args.legacy_gc_load else (0,):
            rows += run_size(n, efs, n_queries, args.expansion_add, args.seed, load, dtypes, args.connectivity)
    print()
    print("| donors | tracked objects per donor | usearch HNSW storage | ef | p50 ms | p99 ms | recall@8 | "
          f"near-recall@8 (within {NEAR}) | max abs similarity error | numpy exact p50 ms | p99 ms | p50 speed-up | deleted during run (leaked) | "
          "searches with a GC pass inside | HNSW build s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['legacy_gc_load']} | {r['dtype']} | {r['ef']} | {r['ann_p50']:.3f} | "
            f"{r['ann_p99']:.3f} | {r['recall']:.4f} | {r['near_recall']:.4f} | {r['sim_err']:.4f} | {r['exact_p50']:.3f} | "
            f"{r['exact_p99']:.3f} | {r['exact_p50'] / r['ann_p50']:.1f}x | "  # type: ignore[operator]
            f"{r['deletes']} ({r['leaked']}) | {r['gc_hit_ann']} | {r['build_s']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
