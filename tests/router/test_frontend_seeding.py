"""The Frontend benchmark's bulk seeding leaves the router in the state seeding a donor at a time leaves it in."""

from __future__ import annotations

import numpy as np

from benchmarks.frontend_path.seed_check import WORKERS, queries, router, seed
from benchmarks.frontend_path.seeded_router import DeferredInserts, _Donors, seeded_state
from semblend_dynamo.events.schemas import DonorRegistration


def test_bulk_seeding_leaves_the_state_of_seeding_one_by_one() -> None:
    n = 700  # bulk turns of 256 (the last one short), the reference's of 200
    bulk, _ = seed(n, "bulk", chunk=256)
    one, _ = seed(n, "one", chunk=200)
    try:
        assert not isinstance(bulk.discovery.index, DeferredInserts)  # type: ignore[union-attr]
        state = seeded_state(bulk)
        assert state == seeded_state(one)
        assert len(state) == 9  # entries, cursors, pending, blocks, counts, pipeline, spans, index, indexer
        assert len(bulk.catalog.resident(bulk.parse({"token_ids": [1]}).namespace.digest())) == n
        # what the benchmark's prompts find: the same spans and decisions (the HNSW's links, hence some of the
        # approximate hits, differ: a parallel insert builds the graph otherwise)
        found, expected = queries(bulk, n, 8), queries(one, n, 8)
        assert (found["spans"], found["decisions"]) == (expected["spans"], expected["decisions"])
    finally:
        bulk.close()
        one.close()


def test_embeddings_drawn_together_are_those_drawn_in_turn() -> None:
    r = router(1)
    together, in_turn = _Donors(r, WORKERS, 1), _Donors(r, WORKERS, 1, drawn_together=False)
    for count in (1, 5, 300):
        assert together.embeddings(count) == in_turn.embeddings(count)
    r.close()


def test_deferred_inserts_reach_the_index_in_order() -> None:
    r = router(1)
    index = r.discovery.index  # type: ignore[union-attr]
    assert index is not None
    deferred = DeferredInserts(index)
    rng = np.random.default_rng(3)
    vectors = [rng.standard_normal(index.dim).astype(np.float32) for _ in range(4)]
    for i, vector in enumerate(vectors):
        assert deferred.insert(f"d{i}", "ns", vector) == []
    assert "d1" in deferred and "d1" not in index
    assert deferred.delete("d3") and "d3" not in deferred
    assert deferred.insert_kept(deferred.take()) == []
    assert list(index._lru) == ["d0", "d1", "d2"]  # keys in insert order
    assert deferred.delete("d1") and "d1" not in index and "d0" in deferred
    assert DonorRegistration.pack_embedding(index.vector("d0"))[1] == index.dim  # type: ignore[arg-type]
    r.close()
