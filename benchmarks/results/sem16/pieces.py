"""The semantic stage piece by piece, in process and warm (best of 7 x 50 passes over 40 span-path prompts, µs per
prompt), in the tree given: `_semantic` whole (discover with the spans known, the donor lookup, the load check, the
hint built), then discover, the planner, the donor lookup, `_hint`, the hint's encoding, the namespace digest and the
hint subject. 2,000 resident donors (`benchmarks/router_under_test.py`).

Usage: `python benchmarks/results/sem16/pieces.py TREE` (or through `ab.sh`)
"""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import asyncio
import collections
import contextlib
import sys
import timeit

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]
from router_under_test import span_path_router, span_target

from semblend_dynamo.outcomes import Outcome


async def main():
    router, donors, rng = await span_path_router(2000)
    prompts = [span_target(rng, donors) for _ in range(40)]
    cases = []
    reasons = collections.Counter()
    for p in prompts:
        routed = router.parse({"token_ids": p}, None)
        spans = router.discovery.find_spans(routed.namespace, routed.token_array)
        d = await router.decide(routed)
        reasons[
            (d.outcome.value, d.reason.value if d.reason else None, len(spans), len(d.hint.spans) if d.hint else -1)
        ] += 1
        cases.append((routed, spans))
    print(reasons)
    disc = router.discovery

    def discover():
        for routed, spans in cases:
            disc.discover(
                routed.request_id,
                routed.namespace,
                routed.token_array,
                exact_prefix_tokens=0,
                embed=False,
                known_spans=spans,
                tenancy=routed.tenancy,
            )

    results = [
        disc.discover(r.request_id, r.namespace, r.token_array, embed=False, known_spans=s, tenancy=r.tenancy)
        for r, s in cases
    ]

    def resident():
        for res in results:
            router.catalog.resident_donor(res.primary_donor)

    entries = [router.catalog.resident_donor(res.primary_donor) for res in results]

    def hint():
        for (routed, _), res, e in zip(cases, results, entries, strict=True):
            router._hint(routed, res, e.donor_id, e.donor_key, e.worker[0], e.worker[1], Outcome.SEMANTIC_PLACEMENT)

    hints = [
        router._hint(routed, res, e.donor_id, e.donor_key, e.worker[0], e.worker[1], Outcome.SEMANTIC_PLACEMENT)
        for (routed, _), res, e in zip(cases, results, entries, strict=True)
    ]

    def encode():
        for h in hints:
            router.publisher.encode(h)

    def plan():
        for routed, spans in cases:
            disc.planner.plan(len(routed.tokens), spans)

    def digest():
        for routed, _ in cases:
            routed.namespace.digest()

    def subject():
        for h in hints:
            router.subjects.hints(h.worker_id)

    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    fut.set_result([{"worker_id": 0x1234, "dp_rank": 0, "active_requests": 0}])
    from semblend_dynamo.router.handler import Decision

    async def semantic_all():
        for routed, spans in cases:
            await router._semantic(routed, Decision(Outcome.COLD_FALLBACK), 0, fut, spans)

    def semantic():
        coro = semantic_all()
        with contextlib.suppress(StopIteration):
            coro.send(None)

    n = len(cases)
    for name, f in [
        ("_semantic (all)", semantic),
        ("discover", discover),
        ("plan", plan),
        ("resident_donor", resident),
        ("_hint", hint),
        ("encode", encode),
        ("digest", digest),
        ("subject", subject),
    ]:
        best = min(timeit.repeat(f, number=50, repeat=7)) / 50 / n * 1e6
        print(f"{name}: {best:.2f} us")


asyncio.run(main())
