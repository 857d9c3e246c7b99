"""The SemBlend router with N resident donors loaded before it reports ready (the Frontend-path benchmark's router).

It is ``python -m semblend_dynamo.router`` (same configuration, same ``serve``) plus a ready hook that registers
``--donors`` prompts of :mod:`.workload` as if this router had served them (``DonorCatalog.add`` with their tokens,
as ``SemanticRouter`` does after a stream), spread over the live workers, and makes them resident by applying
their blocks as kv-events to the catalog. Dynamo's own KV index does not see those blocks, so the requests that
reuse them have no exact overlap and take the semantic stage. The catalog's indexer thread puts them in the discovery
pipeline meanwhile; seeding waits for it every ``SEED_CHUNK`` donors (it queues a bounded number of prompts) and at
the end, so every donor is indexed before the router reports ready.

Usage (environment as for the router): ``python -m benchmarks.frontend_path.seeded_router --donors 100000``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
import time

import numpy as np
from dynamo.llm import compute_block_hash_for_seq

from semblend_dynamo.config import config_from_args
from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored
from semblend_dynamo.router.__main__ import add_arguments, configure_logging, serve
from semblend_dynamo.router.handler import SemanticRouter

from .workload import donor_tokens

log = logging.getLogger("semblend_dynamo.bench")
FIRST_BLOCK_ID = 1 << 40
"""Engine block ids of the seeded blocks, far from any the mockers use."""
SEED_CHUNK = 1024
"""Donors seeded between waits for the indexer (below its bound on queued prompts)."""


def seeder(n: int):
    async def seed(router: SemanticRouter, workers: list[int]) -> None:
        if not workers:
            raise SystemExit("seeded router: no live workers to place donors on")
        t0 = time.perf_counter()
        donors = donor_tokens(n)
        namespace = router.parse({"token_ids": [1]}).namespace
        embedder = router.discovery.embedder if router.discovery is not None else None
        rng = np.random.default_rng(1)
        for i, row in enumerate(donors.tolist()):
            worker = workers[i % len(workers)]
            hashes = compute_block_hash_for_seq(row, router.cfg.block_size)
            embedding, dim = b"", 0
            if embedder is not None:
                vector = rng.standard_normal(embedder.dim).astype(np.float32)
                embedding, dim = DonorRegistration.pack_embedding(vector / np.linalg.norm(vector))
            registration = DonorRegistration(
                donor_id=f"seed-{i}",
                router_id=router.router_id,
                worker_id=worker,
                deployment=router.deployment,
                namespace=namespace.digest(),
                num_tokens=len(row),
                block_size=router.cfg.block_size,
                block_hashes=hashes,
                embedding=embedding,
                embedding_dim=dim,
            )
            router.catalog.add(registration, local=(namespace, row))
            first = FIRST_BLOCK_ID + (i << 8)
            stored = KvStored([first + j for j in range(len(hashes))], hashes)
            router.catalog.apply_kv_events([KvEvent(worker, 0, stored)])
            if i % SEED_CHUNK == SEED_CHUNK - 1:
                await router.drain_registrations(timeout=600)
        await router.drain_registrations(timeout=600)
        indexed = len(router.discovery) if router.discovery is not None else 0
        if indexed != n:
            raise SystemExit(f"seeded router: {indexed} of {n} donors indexed")
        gc.collect()
        gc.freeze()  # long-lived: keep them out of later collections, as a long-running router's old objects are
        log.info(
            "seeded %d resident donors on %d workers in %.0f s",
            len(router.catalog),
            len(workers),
            time.perf_counter() - t0,
        )

    return seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=100_000)
    add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    configure_logging(args.log_level, cfg.log_format)
    return asyncio.run(serve(cfg, ready=seeder(args.donors)))


if __name__ == "__main__":
    sys.exit(main())
