"""Single steps of the semantic router's request path, each timed alone over 40 span-path prompts (2,000 donors), warm
and cold (64 MB written through the caches before each call), µs p50: where a few µs of cold code could go. Session
17, branch spans17.

Usage: ``python benchmarks/results/spans17/pieces_cold.py TREE``
"""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import asyncio
import gc
import sys
import time

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]
import numpy as np
from dynamo.llm import compute_block_hash_for_seq
from router_under_test import span_path_router, span_target

from semblend_dynamo import _native
from semblend_dynamo.events import link as linkmod
from semblend_dynamo.outcomes import Outcome
from semblend_dynamo.router.handler import Decision, _blocks_to_win


async def main():
    router, donors, rng = await span_path_router(2000)
    prompts = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(40)]
    decs = []
    for r in prompts:
        d = await router.decide(r)
        decs.append(d)
    junk = np.ones(64 << 20, dtype=np.uint8)
    cfg = router.cfg
    subj = router.subjects.hints(decs[0].hint.worker_id)
    pieces = {
        "Decision()": lambda r, d: Decision(Outcome.COLD_FALLBACK),
        "_blocks_to_win": lambda r, d: _blocks_to_win(len(r.tokens), cfg.block_size, cfg.exact_route_threshold),
        "slices": lambda r, d: r.tokens[:32] + r.tokens[32 * 204 : 32 * 205],
        "dynamo hash": lambda r, d: compute_block_hash_for_seq(r.tokens[:64], 32, lora_name=None, cache_namespace=None),
        "gate": lambda r, d: router._exact_may_win(r),
        "array_address ro": lambda r, d: _native.array_address(r.token_array),
        "subject": lambda r, d: router.subjects.hints(d.hint.worker_id),
        "fullmatch": lambda r, d: linkmod._PLAIN_SUBJECT.fullmatch(subj),
        "hint model_copy": lambda r, d: d.hint.model_copy(),
        "encode": lambda r, d: router.publisher.encode(d.hint),
        "metric inc": lambda r, d: router.metrics.spans_during_exact_of["used"].inc(),
        "may_seek": lambda r, d: router.policy.may_seek(r.tenancy),
        "find_spans": lambda r, d: router.discovery.find_spans(r.namespace, r.token_array),
    }
    gc.disable()
    for name, f in pieces.items():
        for mode in ("warm", "cold"):
            ts = []
            for r, d in zip(prompts, decs, strict=True):
                if mode == "cold":
                    junk += 1
                t0 = time.perf_counter()
                f(r, d)
                ts.append((time.perf_counter() - t0) * 1e6)
            ts.sort()
            print(f"{name:18s} {mode} p50 {ts[len(ts) // 2]:.2f}")


asyncio.run(main())
