"""``DonorDiscovery.discover`` with the spans found ahead (what the router's semantic stage runs) and ``_result`` alone,
µs per call (best of 3 x 2,000), in the tree given: 400 resident donors, one 8K span-path prompt (8 spans), the
router of ``benchmarks/router_under_test.py``. Run it on two trees in turns.

Usage: ``PYTHONPATH=TREE python benchmarks/results/route12/discover_ab.py TREE``
"""

import asyncio
import sys
import timeit

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]

from router_under_test import TARGET_TOKENS, span_path_router, span_target  # noqa: E402

from semblend_dynamo.pipeline import StageTimings  # noqa: E402


async def main() -> None:
    router, donors, rng = await span_path_router(400)
    routed = router.parse({"token_ids": span_target(rng, donors)})
    discovery = router.discovery
    spans = discovery.find_spans(routed.namespace, routed.token_array)
    result = discovery.discover(
        "r", routed.namespace, routed.token_array, embed=False, known_spans=spans, tenancy=routed.tenancy
    )

    def discover() -> None:
        discovery.discover(
            "r", routed.namespace, routed.token_array, embed=False, known_spans=spans, tenancy=routed.tenancy
        )

    def result_only() -> None:
        discovery._result("r", "ns", TARGET_TOKENS, 0, spans, {}, False, result.decision, StageTimings())

    for name, call in (("discover (spans known)", discover), ("_result", result_only)):
        best = min(timeit.repeat(call, number=2000, repeat=3)) / 2000 * 1e6
        print(f"{name}: {best:.1f} us ({len(spans)} spans, primary {result.primary_donor})")


asyncio.run(main())
