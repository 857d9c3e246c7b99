"""The semantic stage alone, cache-cold, in process: ``SemanticRouter._semantic`` (its load answer already there) and the
``DonorDiscovery.discover`` call it makes, for span-path prompts of session 17's router (2,000 donors, the spans found
beforehand as the router finds them during the exact query), 64 MB written through the caches before each call;
the loop thread's CPU (``time.thread_time``), µs p50 / p90. Each call is made as the tree's own ``_semantic`` makes it
(with ``timed=False`` where the tree's ``discover`` has it). Session 18, branch disc18.

Usage: ``python benchmarks/results/disc18/semantic_cold.py TREE DONORS REQUESTS``
"""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import asyncio
import gc
import inspect
import sys
import time

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]
import numpy as np
import router_under_test as rut
from router_under_test import span_path_router, span_target

from semblend_dynamo.outcomes import Outcome
from semblend_dynamo.router.handler import Decision

cpu = time.thread_time


async def main():
    donors_n, n = int(sys.argv[2]), int(sys.argv[3])
    router, donors, rng = await span_path_router(donors_n)
    disc = router.discovery
    untimed = {"timed": False} if "timed" in inspect.signature(disc.discover).parameters else {}
    rows = [{"worker_id": rut.WORKER, "dp_rank": 0, "active_requests": 0}]
    routed = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(n + 20)]
    spans = [disc.find_spans(r.namespace, r.token_array) for r in routed]
    junk = np.ones(64 << 20, dtype=np.uint8)
    times: dict[str, list[float]] = {"discover": [], "_semantic": []}
    hinted = 0
    gc.disable()
    for k in range(2):
        for i, (r, s) in enumerate(zip(routed, spans, strict=True)):
            await asyncio.sleep(0.001)
            junk += 1
            loads = asyncio.get_running_loop().create_future()
            loads.set_result(rows)
            with router.gate.deciding():
                t0 = cpu()
                if k == 0:
                    disc.discover(
                        r.request_id,
                        r.namespace,
                        r.token_array,
                        exact_prefix_tokens=0,
                        embed=False,
                        known_spans=s,
                        tenancy=r.tenancy,
                        **untimed,
                    )
                else:
                    d = Decision(Outcome.COLD_FALLBACK)
                    await router._semantic(r, d, 0, loads, s)
                t1 = cpu()
            if i >= 20:
                times["discover" if k == 0 else "_semantic"].append((t1 - t0) * 1e6)
                hinted += k == 1 and d.hint is not None
    gc.enable()
    print(f"{TREE} cold {donors_n} donors, {n} requests, {hinted} hinted, discover{'(timed=False)' if untimed else ''}")
    for name, v in times.items():
        print(f"  {name}: p50 {np.percentile(v, 50):.1f} p90 {np.percentile(v, 90):.1f}")


asyncio.run(main())
