"""A finished prompt's ``KvStored`` applied on the router's loop, one tree at a time (session 17, branch kv17): run it
with ``PYTHONPATH`` at each tree, alternating trees, and compare.

On ``benchmarks/router_under_test.py``'s span-path router (of the tree under test) with 20,000 seeded donors (or
``DONORS``), 200 times: an 8K ``span_target`` prompt is added as a donor (``SemanticRouter._add_donor_steps``, on
worker 101 or 102), then ``DonorCatalog.apply_kv_events`` of one ``KvStored`` of its blocks is timed, with fresh
distinct engine block ids (the catalog's indexer drained before each):

* ``store512``: its hashes at 16 tokens a block (512 blocks, none the donor's: the donor stays not resident);
* ``own256``: its hashes at the router's block size (32 tokens, 256 blocks: the donor's own, so it becomes resident).

Usage: ``PYTHONPATH=TREE python benchmarks/results/kv17/store_ab.py LABEL [DONORS]``.
"""

import asyncio
import sys
import time
from pathlib import Path

import numpy as np
from dynamo._core import compute_block_hash_for_seq

import semblend_dynamo
from semblend_dynamo.events.schemas import KvEvent, KvStored

sys.path[:0] = [str(Path(semblend_dynamo.__file__).parents[1] / "benchmarks")]


def summary(name: str, label: str, us: list[float]) -> None:
    p = np.percentile(us, [50, 90, 99])
    print(f"{label} {name}: n={len(us)} p50 {p[0]:.0f} us, p90 {p[1]:.0f} us, p99 {p[2]:.0f} us, max {max(us):.0f} us")


async def bench(label: str, n: int) -> None:
    from router_under_test import BLOCK, span_path_router, span_target

    t0 = time.perf_counter()
    router, donors, rng = await span_path_router(n)
    print(f"{label} seeded {n:,} donors in {time.perf_counter() - t0:.0f} s")
    routed = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(400)]
    next_block, event_ids = 1 << 40, {101: 0, 102: 0}
    for name, block_size, picks in (("store512", 16, routed[:200]), ("own256", BLOCK, routed[200:])):
        us = []
        resident = len(router.catalog._residency.resident(routed[0].namespace.digest()))
        for i, r in enumerate(picks):
            w = 101 + i % 2
            router._add_donor_steps(r, (w, 0), None)
            hashes = compute_block_hash_for_seq(r.tokens, block_size)
            block_ids = list(range(next_block, next_block + len(hashes)))
            next_block += len(hashes)
            event_ids[w] += 1
            event = KvEvent(w, event_ids[w], KvStored(block_ids, hashes))
            router.catalog.drain(10)  # the indexer thread idle: the loop's time alone
            t0 = time.perf_counter()
            router.catalog.apply_kv_events([event])
            us.append((time.perf_counter() - t0) * 1e6)
        now = len(router.catalog._residency.resident(routed[0].namespace.digest()))
        summary(f"apply_kv_events of a KvStored ({name}), {n:,} donors, +{now - resident} resident", label, us)
    router.catalog.drain(10)
    router.close()


def main() -> None:
    label = sys.argv[1]
    donors = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    asyncio.run(bench(label, donors))


main()
