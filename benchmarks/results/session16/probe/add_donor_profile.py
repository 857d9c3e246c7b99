"""Where the donor thread's add of a finished 8K prompt goes (session 16): ``SemanticRouter._add_donor_steps`` on
benchmarks/router_under_test.py's span-path router with 2,000 seeded donors, 20 adds timed, 20 more under cProfile.

Usage: ``python benchmarks/results/session16/probe/add_donor_profile.py`` from the repository root.
"""

import asyncio
import cProfile
import pstats
import sys
import time

sys.path[:0] = [".", "benchmarks"]
from router_under_test import span_path_router, span_target  # noqa: E402


async def main():
    router, donors, rng = await span_path_router(2000)
    routed = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(40)]
    ts = []

    def run(r, i):
        t0 = time.perf_counter()
        router._add_donor_steps(r, (101 + i % 2, 0), None)
        ts.append((time.perf_counter() - t0) * 1e6)

    for i, r in enumerate(routed[:20]):
        run(r, i)
    print("add_donor_steps p50 us", sorted(ts)[10])
    pr = cProfile.Profile()
    pr.enable()
    for i, r in enumerate(routed[20:]):
        run(r, i)
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(18)


asyncio.run(main())
