"""The block maps' merges, one tree at a time (session 17, branch merge17): run it with ``PYTHONPATH`` at each tree,
alternating trees, and compare.

1. ``map``: a U64Map built to 1.6M entries (assigns of 16K sorted keys), then 200 assigns of 512 fresh sorted keys,
   each timed (the overlay's merges and the base's rewrite steps they pace).
2. ``add``: the donor thread's add of a finished 8K prompt (``SemanticRouter._add_donor_steps``) on
   ``benchmarks/router_under_test.py``'s span-path router (of the tree under test) with 20,000 seeded donors (or
   ``DONORS``), 200 adds timed (as ``benchmarks/results/session16/probe/add_donor_profile.py``).

Usage: ``PYTHONPATH=TREE python benchmarks/results/merge17/merge_ab.py LABEL [map] [add] [DONORS]`` (both by default).
"""

import asyncio
import sys
import time
from pathlib import Path

import numpy as np

import semblend_dynamo
from semblend_dynamo.router import u64map
from semblend_dynamo.router.u64map import U64Map

sys.path[:0] = [str(Path(semblend_dynamo.__file__).parents[1] / "benchmarks")]


def summary(name: str, label: str, us: list[float]) -> None:
    p = np.percentile(us, [50, 90, 99])
    print(f"{label} {name}: n={len(us)} p50 {p[0]:.0f} us, p90 {p[1]:.0f} us, p99 {p[2]:.0f} us, max {max(us):.0f} us")


def bench_map(label: str) -> None:
    rng = np.random.default_rng(17)
    keys = np.unique(rng.integers(0, 1 << 64, 1_750_000, dtype=np.uint64, endpoint=False))
    keys = rng.permutation(keys)
    m = U64Map()
    for batch in np.array_split(keys[:1_600_000], 100):
        batch = np.sort(batch)
        m.assign(batch, batch)
    fresh = keys[1_600_000:]
    us = []
    for i in range(200):
        batch = np.sort(fresh[i * 512 : (i + 1) * 512])
        t0 = time.perf_counter()
        m.assign(batch, batch)
        us.append((time.perf_counter() - t0) * 1e6)
    assert len(m) == 1_600_000 + 200 * 512
    summary("map assign of 512 keys, 1.6M entries", label, us)


async def bench_add(label: str, n: int) -> None:
    from router_under_test import span_path_router, span_target

    t0 = time.perf_counter()
    router, donors, rng = await span_path_router(n)
    print(f"{label} seeded {n:,} donors in {time.perf_counter() - t0:.0f} s")
    routed = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(200)]
    us = []
    for i, r in enumerate(routed):
        t0 = time.perf_counter()
        router._add_donor_steps(r, (101 + i % 2, 0), None)
        us.append((time.perf_counter() - t0) * 1e6)
    summary(f"_add_donor_steps, {n:,} donors", label, us)


def main() -> None:
    label, parts = sys.argv[1], [a for a in sys.argv[2:] if not a.isdigit()] or ["map", "add"]
    donors = next((int(a) for a in sys.argv[2:] if a.isdigit()), 20_000)
    merge = getattr(u64map, "NATIVE_MERGE", None)
    print(f"{label}: compiled merge {'on' if merge is not None else 'off'} ({u64map.NATIVE_REASON})")
    if "map" in parts:
        bench_map(label)
    if "add" in parts:
        asyncio.run(bench_add(label, donors))


main()
