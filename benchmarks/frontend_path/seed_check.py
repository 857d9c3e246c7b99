"""The Frontend benchmark's seeded router state, built in-process: how long a seeding takes and what it leaves.

Builds the semantic router as :mod:`.seeded_router` runs it (the benchmark's settings: block size 32, the hash
embedder, index capacity ``max(2·donors, 100K)``), with test doubles for Dynamo's KvRouter and NATS, seeds it with
``--seeding bulk`` (the benchmark's :func:`~.seeded_router.seed_in_bulk`) or ``one`` (the reference,
:func:`~.seeded_router.seed_one_by_one`), and prints one JSON line: the seeding's seconds, the state's digests
(:func:`~.seeded_router.seeded_state`) and what the benchmark's queries find in it (the spans of its span-path prompts
and the decisions and search hits of its prompts that need an embedding).

Usage: ``python -m benchmarks.frontend_path.seed_check --donors 20000 --seeding bulk [--queries 50]``
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from typing import Any

import numpy as np

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.publisher import EvidencePublisher
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.router.__main__ import build_discovery
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.handler import SemanticRouter
from semblend_dynamo.router.metrics import RouterMetrics

from .seeded_router import seed_in_bulk, seed_one_by_one, seeded_state, seeder
from .workload import BLOCK, donor_tokens, span_request, unrelated_request

WORKERS = [101, 202]


def router(donors: int) -> SemanticRouter:
    """The benchmark's semantic router (no Dynamo runtime: nothing is served)."""
    cfg = SemblendConfig(block_size=BLOCK, embedder="hash", index_capacity=max(2 * donors, 100_000), model_id="bench")
    link = NatsLink(cfg, name="seed-check")
    discovery = build_discovery(cfg)
    return SemanticRouter(
        cfg,
        kv_router=None,  # type: ignore[arg-type]
        discovery=discovery,
        catalog=DonorCatalog(cfg.index_capacity, discovery, index_dtype=cfg.index_dtype),
        link=link,
        publisher=EvidencePublisher(link, queue_size=8),
        metrics=RouterMetrics(),
        namespace_of=lambda lora, salt: NamespaceKey(
            model_id=cfg.model_id, tokens_per_block=BLOCK, lora=lora, cache_salt=salt
        ),
        deployment="bench",
        router_id="seed-check",
    )


def seed(
    donors: int, seeding: str, times: dict[str, float] | None = None, **chunks: int
) -> tuple[SemanticRouter, float]:
    """A router seeded with ``donors`` donors the ``seeding`` way (``bulk`` or ``one``); the seconds it took.
    ``times``: the bulk seeding's phases (:func:`~.seeded_router.seed_in_bulk`)."""
    r = router(donors)
    how = seed_in_bulk(donors, times=times, **chunks) if seeding == "bulk" else seed_one_by_one(donors, **chunks)
    t0 = time.perf_counter()
    asyncio.run(seeder(donors, how)(r, WORKERS))
    return r, time.perf_counter() - t0


def queries(r: SemanticRouter, donors: int, count: int) -> dict[str, Any]:
    """What the benchmark's prompts find: the spans of ``count`` span-path prompts, and for ``count`` prompts that
    need an embedding the decision, the search hits, and the hits an exact search would give (the HNSW's recall)."""
    discovery = r.discovery
    assert discovery is not None and discovery.index is not None
    namespace = r.parse({"token_ids": [1]}).namespace
    digest = namespace.digest()
    tokens = donor_tokens(donors)
    rng = np.random.default_rng(11)
    spans = hashlib.sha256()
    for _ in range(count):
        found = discovery.find_spans(namespace, span_request(tokens, rng))
        spans.update(repr([(s.donor_id, s.target_start, s.donor_start, s.length) for s in found or []]).encode())
    index = discovery.index
    ids = list(index._lru)
    matrix = np.stack([v for v in map(index.vector, ids) if v is not None])
    decisions, hits = hashlib.sha256(), hashlib.sha256()
    recall: list[float] = []
    top_k = r.cfg.top_k
    for i in range(count):
        prompt = unrelated_request(rng)
        vector = discovery.embed_prompt(prompt)
        result = discovery.discover(f"q{i}", namespace, prompt, prompt_vector=vector)
        decisions.update(repr((result.decision.reason, result.primary_donor, result.spans)).encode())
        searched = [h.donor_id for h in index.search(digest, vector, top_k)]
        hits.update(repr(searched).encode())
        exact = {ids[j] for j in np.argsort(-(matrix @ vector), kind="stable")[:top_k]}
        recall.append(len(exact & set(searched)) / top_k)
    return {
        "spans": spans.hexdigest()[:16],
        "decisions": decisions.hexdigest()[:16],
        "hits": hits.hexdigest()[:16],
        "recall": round(float(np.mean(recall)), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=20_000)
    parser.add_argument("--seeding", choices=("bulk", "one"), default="bulk")
    parser.add_argument("--queries", type=int, default=50, help="prompts of each kind (0: none)")
    args = parser.parse_args(argv)
    times: dict[str, float] = {}
    r, seconds = seed(args.donors, args.seeding, times)
    out: dict[str, Any] = {"seeding": args.seeding, "donors": args.donors, "seconds": round(seconds, 2)}
    if times:
        out["phases"] = {name: round(value, 2) for name, value in times.items()}
    t0 = time.perf_counter()
    out["state"] = seeded_state(r)
    out["state_s"] = round(time.perf_counter() - t0, 1)
    if args.queries:
        out["queries"] = queries(r, args.donors, args.queries)
    r.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
