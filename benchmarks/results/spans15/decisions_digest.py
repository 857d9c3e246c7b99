"""A digest of the router's decisions and hint bytes for the span-path prompts of ``bench_route_decision.py`` (same
seed), in the tree given: run it on two trees, the digests must match.

Each request's outcome, reason, allowed worker and exact blocks, and its hint encoded as the router sends it (its
random ``trace_id`` and clock fields fixed first). Usage: ``python benchmarks/results/spans15/decisions_digest.py TREE
[DONORS] [REQUESTS]``
"""

import asyncio
import hashlib
import sys

TREE = sys.argv[1]
DONORS = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
REQUESTS = int(sys.argv[3]) if len(sys.argv) > 3 else 200
sys.path[:0] = [TREE, TREE + "/benchmarks"]

from router_under_test import span_path_router, span_target  # noqa: E402

from semblend_dynamo.events.codec import encode  # noqa: E402


async def main() -> None:
    router, donors, rng = await span_path_router(DONORS)
    digest = hashlib.sha256()
    placed = 0
    for i in range(REQUESTS):
        tokens = span_target(rng, donors)
        routed = router.parse({"token_ids": tokens}, None)
        routed.request_id = f"r{i}"
        routed.trace_id = f"t{i}"
        decision = await router.decide(routed)
        row = (decision.outcome, decision.reason, decision.allowed_worker, decision.exact_blocks, decision.salt)
        digest.update(repr(row).encode())
        if decision.hint is not None:
            placed += 1
            hint = decision.hint.model_copy(update={"issued_at": 0.0})
            digest.update(encode(hint, publisher_id=1, sequence=i, published_at_ms=0))
    print(f"{TREE}: {REQUESTS} requests, {placed} hinted, digest {digest.hexdigest()[:24]}")


asyncio.run(main())
