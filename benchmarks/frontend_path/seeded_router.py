"""The SemBlend router with N resident donors loaded before it reports ready (the Frontend-path benchmark's router).

It is ``python -m semblend_dynamo.router`` (same configuration, same ``serve``) plus a ready hook that registers
``--donors`` prompts of :mod:`.workload` as if this router had served them, spread over the live workers, and makes
them resident by storing their blocks with kv-events. Dynamo's own KV index does not see those blocks, so the requests
that reuse them have no exact overlap and take the semantic stage.

Seeding goes through the router's own objects, ``SEED_CHUNK`` donors a turn, with their bulk calls
(:func:`seed_in_bulk`): the turn's registrations in one ``DonorCatalog.add_many`` (their prompts' tokens written to
the catalog's map of prompts waiting for residency first: ``add_many`` takes none), then the turn's kv-events, one a
donor, in one ``apply_kv_events`` call (each donor becomes resident with its event, in order, and the catalog's
indexer thread registers each in the discovery pipeline: spans from its tokens, its embedding), and the turn's
embeddings inserted in the search index with one ``DonorIndex.insert_batch`` (HNSW adds in parallel, the peers' path)
once the indexer has taken them: while seeding, the pipeline holds a stand-in for its index (:class:`DeferredInserts`)
that keeps the inserts for that batch and passes everything else through. The state this leaves is the one
:func:`seed_one_by_one` leaves (a donor at a time through ``DonorCatalog.add`` and ``apply_kv_events``, one HNSW
insert each: the router's path for a served prompt, and this benchmark's seeding up to session 14) but for the HNSW
graph's links, which a parallel insert builds otherwise: :func:`seeded_state` digests it
(``tests/router/test_frontend_seeding.py`` compares the two; :mod:`.seed_check` times them).

Usage (environment as for the router): ``python -m benchmarks.frontend_path.seeded_router --donors 100000``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import numpy as np
import uvloop
from dynamo.llm import compute_block_hash_for_seq

from semblend_dynamo.config import config_from_args
from semblend_dynamo.donor_index import DonorIndex
from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.router.__main__ import add_arguments, configure_logging, serve
from semblend_dynamo.router.handler import SemanticRouter

from .workload import donor_tokens

log = logging.getLogger("semblend_dynamo.bench")
FIRST_BLOCK_ID = 1 << 40
"""Engine block ids of the seeded blocks, far from any the mockers use."""
SEED_CHUNK = 2048
"""Donors seeded a turn, then the indexer is waited for (below the catalog's and the indexer's bounds on queued
prompts: ``PENDING_LOCAL_DONORS``, ``MAX_LOCAL``)."""
EMBEDDING_SEED = 1
"""The seed of the donors' random unit embeddings (drawn in donor order)."""

Seeder = Callable[[SemanticRouter, list[int]], Coroutine[Any, Any, None]]


class _Donors:
    """Donor ``i``'s registration, kv-event and prompt: the same for both seedings."""

    def __init__(self, router: SemanticRouter, workers: list[int], n: int, *, drawn_together: bool = True) -> None:
        if not workers:
            raise SystemExit("seeded router: no live workers to place donors on")
        self.router = router
        self.workers = workers
        self.tokens = donor_tokens(n)
        self.namespace: NamespaceKey = router.parse({"token_ids": [1]}).namespace
        self.digest = self.namespace.digest()
        embedder = router.discovery.embedder if router.discovery is not None else None
        self.dim = 0 if embedder is None else embedder.dim
        self._rng = np.random.default_rng(EMBEDDING_SEED)
        self._together = drawn_together

    def embeddings(self, count: int) -> list[tuple[bytes, int]]:
        """The next ``count`` donors' embeddings, packed (each row normalized alone: the matrix's row norms round
        otherwise, and float16 keeps some of it)."""
        if not self.dim:
            return [(b"", 0)] * count
        if self._together:  # the same numbers as `count` draws of `dim` in turn
            rows = list(self._rng.standard_normal((count, self.dim)).astype(np.float32))
        else:
            rows = [self._rng.standard_normal(self.dim).astype(np.float32) for _ in range(count)]
        return [DonorRegistration.pack_embedding(row / np.linalg.norm(row)) for row in rows]

    def chunk(self, start: int, stop: int) -> Iterator[tuple[DonorRegistration, KvEvent, list[int]]]:
        router, block_size = self.router, self.router.cfg.block_size
        for i, (row, (embedding, dim)) in enumerate(
            zip(self.tokens[start:stop].tolist(), self.embeddings(stop - start), strict=True), start
        ):
            worker = self.workers[i % len(self.workers)]
            hashes = compute_block_hash_for_seq(row, block_size)
            registration = DonorRegistration(
                donor_id=f"seed-{i}",
                router_id=router.router_id,
                worker_id=worker,
                deployment=router.deployment,
                namespace=self.digest,
                num_tokens=len(row),
                block_size=block_size,
                block_hashes=hashes,
                embedding=embedding,
                embedding_dim=dim,
            )
            first = FIRST_BLOCK_ID + (i << 8)
            yield registration, KvEvent(worker, 0, KvStored([first + j for j in range(len(hashes))], hashes)), row


class DeferredInserts:
    """The discovery pipeline's search index while seeding: :meth:`insert` keeps the vector (and answers that nothing
    was evicted) until :meth:`take` hands what was kept to :meth:`insert_kept`, which inserts it with the index's batch
    insert; everything else reads and writes the index (a kept vector counts as indexed). A donor never handed to the
    index is not looked up in it, so the indexer thread does not wait for the index's lock while a batch goes in."""

    def __init__(self, index: DonorIndex) -> None:
        self.index = index
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[str, np.ndarray]] = {}
        self._handed: set[str] = set()

    def insert(self, donor_id: str, namespace: str, vector: Any) -> list[str]:
        with self._lock:
            self._kept.pop(donor_id, None)
            self._kept[donor_id] = (namespace, np.asarray(vector, dtype=np.float32).reshape(-1))
        return []

    def delete(self, donor_id: str) -> bool:
        with self._lock:
            kept = self._kept.pop(donor_id, None) is not None
            handed = donor_id in self._handed
        return (handed and self.index.delete(donor_id)) or kept

    def __contains__(self, donor_id: object) -> bool:
        with self._lock:
            kept, handed = donor_id in self._kept, donor_id in self._handed
        return kept or (handed and donor_id in self.index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.index, name)

    def take(self) -> list[tuple[str, tuple[str, np.ndarray]]]:
        """The vectors kept so far, in the order they came (they count as the index's from now on)."""
        with self._lock:
            kept, self._kept = list(self._kept.items()), {}
            self._handed.update(donor_id for donor_id, _ in kept)
        return kept

    def insert_kept(self, kept: list[tuple[str, tuple[str, np.ndarray]]]) -> list[str]:
        """Insert :meth:`take`'s vectors (a batch per run of one namespace); returns the donors the index evicted."""
        evicted: list[str] = []
        start = 0
        while start < len(kept):
            namespace = kept[start][1][0]
            stop = start
            while stop < len(kept) and kept[stop][1][0] == namespace:
                stop += 1
            ids = [donor_id for donor_id, _ in kept[start:stop]]
            evicted += self.index.insert_batch(ids, namespace, np.stack([v for _, (_, v) in kept[start:stop]]))
            start = stop
        return evicted


def seed_in_bulk(n: int, chunk: int = SEED_CHUNK, times: dict[str, float] | None = None) -> Seeder:
    """The benchmark's seeding: ``chunk`` donors a turn through the catalog's and the index's bulk calls (see the
    module docstring). A turn's registrations are built while the indexer thread takes the turn before, and its
    vectors go to the index (on a worker thread) while the indexer takes the next. ``times`` (if given) gets the
    seconds spent building turns, adding them, waiting for the indexer and for the index."""
    spent = times if times is not None else {}

    async def seed(router: SemanticRouter, workers: list[int]) -> None:
        donors = _Donors(router, workers, n)
        catalog, discovery = router.catalog, router.discovery
        pending = catalog._local_tokens  # add_many takes no prompts: the ones a turn makes resident
        index = discovery.index if discovery is not None else None
        deferred = DeferredInserts(index) if discovery is not None and index is not None else None
        inserting: asyncio.Future[list[str]] | None = None

        async def hand_over() -> None:
            """The indexer has taken every turn added: their vectors go to the index after the turns before."""
            nonlocal inserting
            t0 = time.perf_counter()
            await router.drain_registrations(timeout=600)
            t1 = time.perf_counter()
            if inserting is not None and await inserting:
                raise SystemExit("seeded router: the search index evicted seeded donors (capacity)")
            inserting = None
            t2 = time.perf_counter()
            spent["indexer"] = spent.get("indexer", 0.0) + t1 - t0
            spent["index"] = spent.get("index", 0.0) + t2 - t1
            if deferred is not None:
                inserting = asyncio.ensure_future(asyncio.to_thread(deferred.insert_kept, deferred.take()))

        if deferred is not None:
            discovery.index = deferred  # type: ignore[assignment,union-attr]
        try:
            for start in range(0, n, chunk):
                t0 = time.perf_counter()
                registrations, events, rows = [], [], []
                for registration, event, row in donors.chunk(start, min(n, start + chunk)):
                    registrations.append(registration)
                    events.append(event)
                    rows.append((registration.donor_id, (donors.namespace, row)))
                spent["build"] = spent.get("build", 0.0) + time.perf_counter() - t0
                await hand_over()
                t0 = time.perf_counter()
                pending.update(rows)
                if catalog.add_many(registrations) != len(registrations):
                    raise SystemExit("seeded router: the catalog did not take a turn's donors")
                catalog.apply_kv_events(events)  # each donor becomes resident with its event, in order
                await _flush_kv_events(router)
                if pending:
                    raise SystemExit("seeded router: a turn's donors did not all become resident")
                spent["add"] = spent.get("add", 0.0) + time.perf_counter() - t0
            await hand_over()
            await hand_over()
        finally:
            if inserting is not None:
                await asyncio.wait([inserting])
            if deferred is not None:
                discovery.index = index  # type: ignore[union-attr]

    return seed


async def _flush_kv_events(router: SemanticRouter) -> None:
    """Apply the kv-event batches queued because another thread held the catalog's lock (the router's loop flushes
    them soon after; a seeding's last batch has no later one to apply it)."""
    while router.catalog.kv_queued:
        router.catalog.flush_kv_events()
        await asyncio.sleep(0.001)


def seed_one_by_one(n: int, chunk: int = 1024) -> Seeder:
    """The reference seeding: per donor ``DonorCatalog.add`` with its prompt and its kv-event alone, as the router
    does for a served prompt (the indexer waited for every ``chunk`` donors: it queues a bounded number of prompts)."""

    async def seed(router: SemanticRouter, workers: list[int]) -> None:
        donors = _Donors(router, workers, n, drawn_together=False)
        for start in range(0, n, chunk):
            for registration, event, row in donors.chunk(start, min(n, start + chunk)):
                router.catalog.add(registration, local=(donors.namespace, row))
                router.catalog.apply_kv_events([event])
            await _flush_kv_events(router)
            await router.drain_registrations(timeout=600)

    return seed


def seeder(n: int, seed: Seeder | None = None) -> Seeder:
    """The ready hook: ``seed`` (:func:`seed_in_bulk` by default) ``n`` donors, check that all are indexed, and keep
    them out of later garbage collections."""
    seed = seed or seed_in_bulk(n)

    async def ready(router: SemanticRouter, workers: list[int]) -> None:
        t0 = time.perf_counter()
        await seed(router, workers)
        await router.drain_registrations(timeout=600)
        indexed = len(router.discovery) if router.discovery is not None else 0
        if indexed != n:
            counters = {} if router.catalog.indexer is None else dict(router.catalog.indexer.counters)
            pipeline = {} if router.discovery is None else dict(router.discovery.counters)
            raise SystemExit(
                f"seeded router: {indexed} of {n} donors indexed (indexer {counters}, pipeline {pipeline}, "
                f"{len(router.catalog)} in the catalog)"
            )
        gc.collect()
        gc.freeze()  # long-lived: keep them out of later collections, as a long-running router's old objects are
        log.info(
            "seeded %d resident donors on %d workers in %.0f s",
            len(router.catalog),
            len(workers),
            time.perf_counter() - t0,
        )

    return ready


def seeded_state(router: SemanticRouter) -> dict[str, str]:
    """Digests of the donor state the seeding left, by part (the registration times, which differ from run to run,
    left out; so are the HNSW graph's links): the catalog's entries and cursors, every worker's block maps, the
    pipeline's donors, their spans' tables and the search index's keys, namespaces and stored vectors."""
    catalog = router.catalog
    residency = catalog._residency  # private state: a check reads all of it
    parts: dict[str, hashlib._Hash] = {}

    def part(name: str, *values: object) -> None:
        parts.setdefault(name, hashlib.sha256()).update(repr(values).encode())

    for entry in sorted(residency._donors.values(), key=lambda e: e.slot):
        part(
            "entries",
            entry.slot,
            entry.donor_id,
            entry.donor_key,
            entry.router_id,
            entry.worker,
            entry.deployment,
            entry.namespace,
            entry.num_tokens,
            entry.block_size,
            entry.missing,
            entry.embedding_dim,
            entry.embedding_codes,
            entry.own_embedding,
            list(entry.block_hashes),
        )
    page = catalog.page(0, len(catalog) + 1)
    cursors = [(cursor, entry.donor_id) for cursor, entry in zip(page.cursors, page.entries, strict=True)]
    part("cursors", cursors, page.more, catalog.last_cursor)
    part("pending", list(catalog._local_tokens))
    for key in sorted(residency._workers):
        blocks = residency._workers[key]
        by_block = blocks.by_block.arrays()
        hashes = blocks.hashes.arrays()
        order, hash_order = np.argsort(by_block[0]), np.argsort(hashes[0])
        part(
            "blocks",
            key,
            blocks.last_event_id,
            by_block[0][order].tobytes(),
            by_block[1][order].tobytes(),
            hashes[0][hash_order].tobytes(),
            hashes[1][hash_order].tobytes(),
            sorted((h, sorted(s)) for h, s in blocks.shared.items()),
        )
    part("counts", residency.donors_per_worker(), residency.event_gaps, dict(residency.ignored_events))
    discovery = router.discovery
    if discovery is not None:
        part("pipeline", list(discovery._donors.items()), discovery._generation, discovery._peers)
        aligner = discovery.aligner
        for donor_id in discovery._donors:
            donor = aligner._donors[donor_id]
            part(
                "spans",
                donor_id,
                donor.serial,
                donor.namespace,
                donor.tokens.tobytes(),
                donor.chunk_hashes,
                donor.postings,
            )
        index = discovery.index
        if index is not None:
            part("index", list(index._lru.items()), index._next_serial)
            for donor_id in index._lru:
                vector = index.vector(donor_id)
                part("index", donor_id, index.namespace_of(donor_id), None if vector is None else vector.tobytes())
    if catalog.indexer is not None:
        counters = catalog.indexer.counters
        part("indexer", sorted(catalog.indexer._pending.items()), counters["applied"], counters["errors"])
    return {name: digest.hexdigest()[:16] for name, digest in sorted(parts.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=100_000)
    add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    configure_logging(args.log_level, cfg.log_format)
    return uvloop.run(serve(cfg, ready=seeder(args.donors)))  # as the router's run()


if __name__ == "__main__":
    sys.exit(main())
