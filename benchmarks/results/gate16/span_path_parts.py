"""The span path's steps outside the compiled search, timed one by one in the tree given (session 16, branch gate16).

A router of ``benchmarks/router_under_test.py`` with DONORS resident donors of 512 tokens; 60 parsed 8K-token
span-path prompts (no worker holds an exact win: the gate lets the search run). Each step runs over all prompts,
ROUNDS times warm and ROUNDS / 10 times cold (256 MB written through the caches before each call); µs p50 / p90 of
the per-call times:

* ``gate``: ``SemanticRouter._exact_may_win`` (Dynamo's hash of the two blocks, ``stored_together``);
* ``find_spans``: ``DonorDiscovery.find_spans`` (the target, digest, lock, ``align`` and its compiled call, the spans);
* ``spans_during_exact``: the whole span path (``_spans_during_exact``: gate, search, timing);
* ``sa_align``: the compiled call alone (the same arguments as ``find_spans`` passes), for the part outside it.

Usage: ``PYTHONPATH=TREE python benchmarks/results/gate16/span_path_parts.py TREE DONORS [ROUNDS]``; run it on two
trees in turns.
"""

import asyncio
import gc
import sys
import time

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]

import numpy as np  # noqa: E402
from router_under_test import span_path_router, span_target  # noqa: E402

from semblend_dynamo import _native  # noqa: E402
from semblend_dynamo.outcomes import Outcome  # noqa: E402
from semblend_dynamo.router.handler import Decision  # noqa: E402


def timed(step, prompts, rounds, junk=None):
    times = []
    for _ in range(rounds):
        for routed in prompts:
            if junk is not None:
                junk += 1
            t0 = time.perf_counter()
            step(routed)
            times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.9)]


async def main() -> None:
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    router, donors, rng = await span_path_router(int(sys.argv[2]))
    discovery = router.discovery
    aligner = discovery.aligner
    prompts = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(60)]
    assert not any(router._exact_may_win(p) for p in prompts)
    table = next(iter(aligner._tables.values()))

    def raw(routed):
        call = aligner._call
        call.run(table.native_view(), aligner._book.native_view(), routed.token_array, 16, None)

    steps = {
        "gate": router._exact_may_win,
        "find_spans": lambda r: discovery.find_spans(r.namespace, r.token_array),
        "spans_during_exact": lambda r: router._spans_during_exact(r, Decision(Outcome.COLD_FALLBACK)),
        "sa_align": raw,
    }
    junk = np.ones(256 << 20, dtype=np.uint8)
    gc.disable()
    for step in steps.values():
        timed(step, prompts, 1)  # warm
    for mode in ("warm", "cold"):
        for name, step in steps.items():
            cold = mode == "cold"
            p50, p90 = timed(step, prompts, max(1, rounds // 10) if cold else rounds, junk if cold else None)
            print(f"{mode} {name}: p50 {p50:.1f} us, p90 {p90:.1f} us")
    print("native:", _native.REASON)


asyncio.run(main())
