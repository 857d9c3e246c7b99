"""The router's span search (``DonorDiscovery.find_spans``, 8K-token span-path prompts) with warm and cold caches, in
the tree given (session 15, branch cold15).

A router of ``benchmarks/router_under_test.py`` with DONORS resident donors of 512 tokens; 60 prompts (8 donors in
another order among random tokens), each searched once per mode, µs p50 / p90:

* ``warm-same``: the same prompt every time (everything it reads stays cached: the in-process benchmarks' case);
* ``fresh``: a new prompt each time (the filter's lines it reads are new ones);
* ``cold``: a new prompt after 256 MB were written (nothing of the tables left in the caches: through the Frontend
  the router's process waits ~20 ms between requests while the other processes run).

Usage: ``PYTHONPATH=TREE python benchmarks/results/cold15/cold_spans.py TREE DONORS``; run it on two trees in turns.
"""

import asyncio
import sys
import time

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]

import numpy as np  # noqa: E402
from router_under_test import span_path_router, span_target  # noqa: E402


async def main() -> None:
    router, donors, rng = await span_path_router(int(sys.argv[2]))
    discovery = router.discovery
    table = next(iter(discovery.aligner._tables.values()))
    print(f"{sys.argv[2]} donors, filter {table._bits.nbytes / 2**20:.1f} MiB")
    prompts = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(60)]
    junk = np.ones(256 << 20, dtype=np.uint8)
    for mode in ("warm-same", "fresh", "cold"):
        times = []
        for routed in prompts:
            if mode == "cold":
                junk += 1
            prompt = prompts[0] if mode == "warm-same" else routed
            t0 = time.perf_counter()
            discovery.find_spans(prompt.namespace, prompt.token_array)
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        print(f"{mode}: p50 {times[len(times) // 2]:.1f} us, p90 {times[int(len(times) * 0.9)]:.1f} us")


asyncio.run(main())
