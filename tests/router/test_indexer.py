"""PipelineIndexer: the catalog's donor changes reach the pipeline in order, bounded, drained, evictions reported."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.index_snapshot import file_digest
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.pipeline import DonorDiscovery
from semblend_dynamo.router import indexer as indexer_module
from semblend_dynamo.router.__main__ import build_discovery
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.indexer import PipelineIndexer, RequestGate
from tests.support.catalog_donors import registration, stored
from tests.support.gates import GateDecidingAfterFirstWait

NS = NamespaceKey(model_id="m", tokens_per_block=16)


class RecordingDiscovery:
    """Stands in for DonorDiscovery: records each call; every call sets ``entered`` and waits for ``gate``; may report
    evictions."""

    def __init__(self, evict: Sequence[str] = ()) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.evict = list(evict)
        self.index = None

    def register_donor(self, donor_id: str, namespace: NamespaceKey, tokens: Sequence[int], **_: Any) -> list[str]:
        self.entered.set()
        self.gate.wait(10)
        self.calls.append(("local", donor_id))
        return []

    def register_embeddings(self, donor_ids: Sequence[str], namespace: str, vectors: np.ndarray) -> list[str]:
        self.entered.set()
        self.gate.wait(10)
        self.calls.append(("peers", tuple(donor_ids)))
        evicted, self.evict = self.evict, []
        return evicted

    def remove_donor(self, donor_id: str) -> bool:
        self.entered.set()
        self.gate.wait(10)
        self.calls.append(("remove", donor_id))
        return True

    def __contains__(self, donor_id: object) -> bool:
        """Whether the calls so far leave the donor in the pipeline."""
        held = False
        for kind, what in self.calls:
            if kind == "remove" and what == donor_id:
                held = False
            elif (kind == "local" and what == donor_id) or (kind == "peers" and donor_id in what):
                held = True
        return held


def _indexer(discovery: RecordingDiscovery, **bounds: int) -> tuple[PipelineIndexer, list[list[str]]]:
    reported: list[list[str]] = []
    return PipelineIndexer(discovery, reported.append, **bounds), reported  # type: ignore[arg-type]


class PeerStub:
    """Stands in for a catalog entry: a peer donor whose vector reads are counted."""

    def __init__(self, donor_id: str, namespace: str = "ns") -> None:
        self.donor_id = donor_id
        self.namespace = namespace
        self.reads = 0
        self.own_embedding: bytes | None = None

    def vector(self) -> np.ndarray:
        self.reads += 1
        return np.full(4, len(self.donor_id), dtype=np.float32)


def _peer(donor_id: str) -> PeerStub:
    return PeerStub(donor_id)


def test_changes_apply_in_the_order_queued_and_peers_batch_between_other_changes() -> None:
    discovery = RecordingDiscovery()
    discovery.gate.clear()
    indexer, _ = _indexer(discovery)
    indexer.add_peers([_peer("p0")])  # taken alone while the gate is shut
    assert discovery.entered.wait(10)
    for change in (("peer", "p1"), ("peer", "p2"), ("local", "l1"), ("remove", "p1"), ("peer", "p1"), ("peer", "p3")):
        if change[0] == "peer":
            indexer.add_peers([_peer(change[1])])
        elif change[0] == "local":
            indexer.add_local(change[1], NS, [1, 2, 3], None)
        else:
            indexer.remove(change[1])
    discovery.gate.set()
    assert indexer.drain(10)
    assert discovery.calls[1:] == [
        ("peers", ("p1", "p2")),
        ("local", "l1"),
        ("remove", "p1"),
        ("peers", ("p1", "p3")),
    ]
    assert indexer.backlog == 0 and indexer.counters["applied"] == 7


def test_a_removal_is_queued_only_for_a_donor_the_pipeline_may_hold() -> None:
    """Queued: a donor with a local add queued, any donor while peers' adds are queued (they are not counted one by
    one), a donor in the pipeline. Not queued: any other."""
    discovery = RecordingDiscovery()
    discovery.gate.clear()
    indexer, _ = _indexer(discovery)
    indexer.remove("never-added")
    indexer.add_peers([_peer("p"), _peer("q")])
    indexer.remove("p")  # its add still queued
    indexer.remove("other")  # peers' adds queued: it may be one of them
    discovery.gate.set()
    assert indexer.drain(10)
    indexer.remove("p")  # already removed: nothing there
    indexer.remove("q")  # applied: in the pipeline
    indexer.add_local("l", NS, [1], None)
    indexer.remove("l")
    assert indexer.drain(10)
    assert discovery.calls == [
        ("peers", ("p", "q")),
        ("remove", "p"),
        ("remove", "other"),
        ("remove", "q"),
        ("local", "l"),
        ("remove", "l"),
    ]
    indexer.remove("never-added")
    assert indexer.drain(10) and discovery.calls[-1] == ("remove", "l")
    assert indexer._pending == {}  # nothing queued: no per-donor state left


def test_adds_beyond_the_bounds_are_dropped_and_counted_and_an_older_copy_is_removed() -> None:
    discovery = RecordingDiscovery()
    discovery.gate.clear()
    dropped: list[tuple[str, str]] = []
    indexer, _ = _indexer(discovery, max_pending=3, max_local=1)
    indexer.on_dropped = lambda kind, reason: dropped.append((kind, reason))
    indexer.add_peers([_peer("p0")])  # being applied (blocked at the gate): still counts
    assert discovery.entered.wait(10)
    indexer.add_local("l1", NS, [1], None)
    indexer.add_local("l2", NS, [1], None)  # over max_local
    indexer.add_peers([_peer("p1")])
    indexer.add_peers([_peer("p0")])  # over max_pending, and p0 is fed: its older copy must go
    assert dropped == [("local", "queue_full"), ("peer", "queue_full")]
    assert indexer.counters["dropped:local:queue_full"] == 1 and indexer.counters["dropped:peer:queue_full"] == 1
    discovery.gate.set()
    assert indexer.drain(10)
    # l2 may be held while peers' adds are queued: its removal goes too (a no-op for the pipeline)
    assert discovery.calls == [
        ("peers", ("p0",)),
        ("local", "l1"),
        ("remove", "l2"),
        ("peers", ("p1",)),
        ("remove", "p0"),
    ]
    indexer.add_local("l3", NS, [1], None)  # room again once applied
    assert indexer.drain(10) and discovery.calls[-1] == ("local", "l3")


def test_close_applies_what_is_queued_or_counts_what_it_could_not() -> None:
    discovery = RecordingDiscovery()
    indexer, _ = _indexer(discovery)
    indexer.add_peers([_peer("a")])
    indexer.close()
    assert discovery.calls == [("peers", ("a",))] and indexer.backlog == 0
    indexer.add_peers([_peer("b")])
    indexer.remove("a")
    assert indexer.counters["dropped:peer:closed"] == 1 and indexer.counters["dropped:remove:closed"] == 1

    stuck = RecordingDiscovery()
    stuck.gate.clear()
    indexer, _ = _indexer(stuck)
    indexer.add_local("x", NS, [1], None)
    assert stuck.entered.wait(10)
    for donor_id in ("y", "z"):
        indexer.add_local(donor_id, NS, [1], None)
    assert not indexer.drain(0.05)
    indexer.close(timeout=0.05)  # x is being applied, y and z wait behind the gate
    assert indexer.counters["dropped:local:closed"] == 2 and indexer.backlog <= 1
    stuck.gate.set()


def test_evictions_the_pipeline_reports_go_to_the_callback_outside_any_pipeline_call() -> None:
    discovery = RecordingDiscovery(evict=["old"])
    indexer, reported = _indexer(discovery)
    indexer.add_peers([_peer("new")])
    assert indexer.drain(10) and reported == [["old"]] and indexer.counters["evicted"] == 1


def test_a_queued_peer_holds_no_copy_of_its_vector_and_goes_back_once_indexed() -> None:
    discovery = RecordingDiscovery()
    discovery.gate.clear()
    indexed: list[object] = []
    indexer = PipelineIndexer(discovery, lambda ids: None, indexed.extend)  # type: ignore[arg-type]
    first = _peer("p0")
    indexer.add_peers([first])
    assert discovery.entered.wait(10)
    queued = [_peer(f"p{i}") for i in range(1, 6)]
    for peer in queued:
        indexer.add_peers([peer])
    assert [peer.reads for peer in queued] == [0] * 5
    discovery.gate.set()
    assert indexer.drain(10)
    assert [peer.reads for peer in (first, *queued)] == [1] * 6
    assert len(indexed) == 6 and all(a is b for a, b in zip(indexed, (first, *queued), strict=True))


def test_a_held_indexer_takes_no_batch_until_released_or_the_hold_runs_out_and_closes_anyway(monkeypatch) -> None:
    discovery = RecordingDiscovery()
    indexer, _ = _indexer(discovery)
    indexer.hold(True)
    indexer.add_peers([_peer("p0")])
    assert indexer.held and not indexer.drain(0.1) and discovery.calls == []
    indexer.hold(False)
    assert not indexer.held and indexer.drain(10) and discovery.calls == [("peers", ("p0",))]
    monkeypatch.setattr(indexer_module, "MAX_HOLD_S", 0.05)
    indexer.hold(True)
    indexer.add_peers([_peer("p1")])
    assert indexer.drain(10) and discovery.calls[-1] == ("peers", ("p1",)) and not indexer.held  # it ran out
    monkeypatch.setattr(indexer_module, "MAX_HOLD_S", 30.0)
    indexer.hold(True)
    indexer.add_peers([_peer("p2")])
    indexer.close()
    assert discovery.calls[-1] == ("peers", ("p2",)) and indexer.backlog == 0


def test_background_steps_wait_while_a_request_is_decided_but_never_for_ever() -> None:
    gate = RequestGate(max_wait_s=30)
    stepped = threading.Event()
    with gate.deciding():
        thread = threading.Thread(target=lambda: (gate.wait(), stepped.set()))
        thread.start()
        assert not stepped.wait(0.05)
    assert stepped.wait(10)
    saturated = RequestGate(max_wait_s=0.01)
    with saturated.deciding():
        saturated.wait()  # returns after max_wait_s though the loop is still deciding


# --- with the catalog and the real pipeline ------------------------------------------------------------------------
class GatedDiscovery(DonorDiscovery):
    """The real pipeline whose mutations first wait for ``gate`` (so changes pile up before the indexer runs)."""

    gate: threading.Event

    def register_embeddings(self, donor_ids: Sequence[str], namespace_digest: str, vectors: np.ndarray) -> list[str]:
        self.gate.wait(10)
        return super().register_embeddings(donor_ids, namespace_digest, vectors)


def _gated(
    capacity: int = 100, catalog_capacity: int = 1000, backend: str = "auto"
) -> tuple[DonorCatalog, GatedDiscovery]:
    plain = build_discovery(
        SemblendConfig(block_size=16, embedder="hash", index_capacity=capacity, index_backend=backend)
    )
    assert plain is not None and plain.embedder is not None and plain.index is not None
    discovery = GatedDiscovery(
        plain.cfg, embedder=plain.embedder, index=plain.index, aligner=plain.aligner, background=False
    )
    discovery.gate = threading.Event()
    return DonorCatalog(catalog_capacity, discovery), discovery


def test_a_donor_added_then_removed_before_the_indexer_runs_never_stays_in_the_pipeline() -> None:
    catalog, discovery = _gated()
    assert discovery.index is not None
    dim = discovery.index.dim
    catalog.apply_kv_events([stored(1, 1, 2, 3)])
    catalog.add(registration("first", [1], dim))  # the indexer takes it and waits at the gate
    catalog.add(registration("gone", [2], dim))
    catalog.forget("gone")
    catalog.add(registration("kept", [3], dim))
    assert "gone" not in catalog and "kept" in catalog  # the catalog is current at once
    discovery.gate.set()
    assert catalog.drain(10)
    assert "gone" not in discovery and "gone" not in discovery.index
    assert {"first", "kept"} == {d for d in ("first", "gone", "kept") if d in discovery and d in discovery.index}


def test_a_sync_larger_than_the_old_fixed_bound_indexes_every_resident_donor() -> None:
    """A late replica adds a peer's whole catalog at once, far faster than the index takes it. The indexer's queue
    was bounded at 65,536 adds whatever the catalog held (each held a float32 copy of the vector), so a larger sync
    left most donors out of the search index for good. Now every resident donor reaches it, none is dropped, and the
    catalog keeps no copy of a vector the index holds."""
    n = 70_000
    catalog, discovery = _gated(capacity=n, catalog_capacity=n, backend="numpy")
    index = discovery.index
    assert index is not None and catalog.indexer is not None
    catalog.apply_kv_events([stored(1, *range(1, n + 1))])
    catalog.add(registration("first", [1], index.dim))  # the indexer takes it and waits at the gate
    catalog.add_many(registration(f"p{i}", [i], index.dim) for i in range(2, n + 1))
    assert len(catalog.resident("ns")) == n
    discovery.gate.set()
    assert catalog.drain(60)
    assert not [k for k in catalog.indexer.counters if k.startswith("dropped")]
    resident = catalog.resident("ns")
    assert len(resident) == n and all(d in index for d in resident)
    assert not any(e is not None and e.embedded for e in map(catalog.resident_donor, resident))


def test_donors_the_index_evicts_leave_the_catalog() -> None:
    catalog, discovery = _gated(capacity=2)
    discovery.gate.set()
    assert discovery.index is not None
    dim = discovery.index.dim
    catalog.apply_kv_events([stored(1, *range(1, 6))])
    for i in range(1, 6):
        catalog.add(registration(f"d{i}", [i], dim))
        assert catalog.drain(10)
    resident = catalog.resident("ns")
    assert len(resident) == 2 and resident == {d for d in resident if d in discovery.index}
    assert all(f"d{i}" not in catalog for i in (1, 2, 3))


def test_the_heap_is_trimmed_once_the_changes_stop_whatever_their_number(monkeypatch) -> None:
    """A bulk's last changes (fewer than ``TRIM_AFTER`` since the last trim) leave freed heap too: once no change has
    come for ``QUIET_TRIM_S``, the thread trims, once."""
    trims: list[int] = []
    monkeypatch.setattr(indexer_module, "QUIET_TRIM_S", 0.05)
    monkeypatch.setattr(indexer_module, "trim_heap", lambda: trims.append(1) or True)
    indexer, _ = _indexer(RecordingDiscovery())
    assert not indexer.trim_pending
    indexer.add_peers([_peer("p0"), _peer("p1")])
    assert indexer.drain(10)
    for _ in range(200):
        if trims:
            break
        time.sleep(0.01)
    assert trims == [1] and indexer.counters["heap_trims"] == 1
    for _ in range(100):  # the trim is counted once it is done
        if not indexer.trim_pending:
            break
        time.sleep(0.01)
    assert not indexer.trim_pending
    time.sleep(0.2)
    assert trims == [1]  # idle: no more
    indexer.remove("p0")
    assert indexer.drain(10)
    for _ in range(200):
        if len(trims) == 2:
            break
        time.sleep(0.01)
    assert trims == [1, 1]


def test_the_heap_is_trimmed_once_a_bulk_of_changes_is_applied_and_the_queue_is_empty(monkeypatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(indexer_module, "QUIET_TRIM_S", 60.0)
    monkeypatch.setattr(indexer_module, "TRIM_AFTER", 3)
    monkeypatch.setattr(indexer_module, "trim_heap", lambda: trims.append(1) or True)
    discovery = RecordingDiscovery()
    indexer, _ = _indexer(discovery)
    indexer.add_peers([_peer("p0")])
    indexer.add_peers([_peer("p1")])
    assert indexer.drain(10) and trims == []  # 2 changes: not yet
    indexer.add_peers([_peer("p2")])
    indexer.remove("p0")
    assert indexer.drain(10) and trims == [1] and indexer.counters["heap_trims"] == 1
    indexer.add_peers([_peer("p3")])
    assert indexer.drain(10) and trims == [1]  # counted afresh after a trim


class CommittingDiscovery(RecordingDiscovery):
    """Records a local add once its ``before_commit`` pause returned (where the real pipeline takes its lock), and
    whether the indexer's thread counted as stepping then."""

    request_gate: RequestGate

    def register_donor(self, donor_id: str, namespace: NamespaceKey, tokens: Sequence[int], **kw: Any) -> list[str]:
        if kw.get("before_commit") is not None:
            kw["before_commit"]()
        self.calls.append(("local", donor_id))
        self.stepping = self.request_gate.stepping()
        return []


def test_a_local_donor_is_committed_only_after_a_decision_that_started_while_it_was_hashed() -> None:
    discovery = CommittingDiscovery()
    indexer, _ = _indexer(discovery)
    gate = indexer.gate = discovery.request_gate = GateDecidingAfterFirstWait()
    indexer.add_local("d", NS, list(range(64)), None)
    assert not indexer.drain(0.2) and discovery.calls == []
    gate.deciding_now.__exit__(None, None, None)
    assert indexer.drain(10) and discovery.calls == [("local", "d")]
    assert discovery.stepping and not gate.stepping()  # stepping while it committed, resting once the batch is done


def _usearch_catalog(capacity: int = 1000) -> DonorCatalog:
    discovery = build_discovery(
        SemblendConfig(block_size=16, embedder="hash", index_capacity=capacity, index_backend="usearch")
    )
    assert discovery is not None
    return DonorCatalog(capacity, discovery)


def test_a_loaded_snapshot_skips_the_adds_it_holds_and_ends_with_exactly_the_catalogs_donors(tmp_path) -> None:
    """A late replica loads its peer's saved index ahead of the sync's adds: a donor the index holds with the add's
    vector is not inserted again, one with another vector is, one the sync does not bring is pruned."""
    peer = _usearch_catalog()
    assert peer.indexer is not None and peer.indexer.discovery.index is not None
    dim = peer.indexer.discovery.index.dim
    peer.apply_kv_events([stored(1, *range(1, 41))])
    peer.add_many(registration(f"p{i}", [i], dim) for i in range(1, 41))
    assert peer.drain(10)
    path = str(tmp_path / "peer.snapshot")
    peer.indexer.discovery.index.save_snapshot(path)

    late = _usearch_catalog()
    indexer = late.indexer
    assert indexer is not None and indexer.discovery.index is not None
    index = indexer.discovery.index
    indexer.hold(True)  # the sync's adds queue behind the load
    late.apply_kv_events([stored(1, *range(1, 42))])
    late.add_many(registration(f"p{i}", [i], dim) for i in range(2, 39))  # p1 and p40 left the peer since
    late.add(registration("p39", [39], dim, registered_at=2.0).model_copy(update={"embedding": b"\x00\x3c" * dim}))
    late.add(registration("new", [41], dim))
    loads: list[tuple[int, str]] = []
    indexer.load_snapshot(path, file_digest(path), lambda donors, reason: loads.append((donors, reason)))
    indexer.hold(False)
    indexer.prune()
    assert late.drain(10)

    assert loads == [(40, "loaded")]
    resident = late.resident("ns")
    assert resident == {f"p{i}" for i in range(2, 40)} | {"new"}
    assert {d for d in [*resident, "p1", "p40"] if d in index} == resident
    assert {d for d in [*resident, "p1", "p40"] if d in indexer.discovery} == resident
    assert indexer.counters["snapshot_confirmed"] == 37 and indexer.counters["snapshot_pruned"] == 2
    assert np.allclose(index.vector("p39"), np.full(dim, dim**-0.5), atol=1e-2)  # the sync's vector, not the peer's
    assert not any(e is not None and e.embedded for e in map(late.resident_donor, resident))
    # each id is held once: the loaded index keeps the catalog's own strings (the file's copies cost ~70 B a donor)
    entries = {d: late.resident_donor(d) for d in resident}
    assert all(index._ids[index._lru[d]] is e.donor_id for d, e in entries.items() if e is not None)
    assert all(next(k for k in index._lru if k == d) is e.donor_id for d, e in entries.items() if e is not None)


def test_a_snapshot_that_does_not_load_leaves_the_adds_to_index_every_donor(tmp_path) -> None:
    peer = _usearch_catalog()
    assert peer.indexer is not None and peer.indexer.discovery.index is not None
    dim = peer.indexer.discovery.index.dim
    peer.apply_kv_events([stored(1, 1, 2)])
    peer.add_many(registration(f"p{i}", [i], dim) for i in (1, 2))
    assert peer.drain(10)
    path = str(tmp_path / "peer.snapshot")
    peer.indexer.discovery.index.save_snapshot(path)

    for digest, reason in (("0" * 32, "digest_mismatch"), (file_digest(path), "not_empty")):
        late = _usearch_catalog()
        indexer = late.indexer
        assert indexer is not None
        late.apply_kv_events([stored(1, 1, 2, 3)])
        if reason == "not_empty":
            late.add(registration("mine", [3], dim))
            assert late.drain(10)
        indexer.hold(True)
        late.add_many(registration(f"p{i}", [i], dim) for i in (1, 2))
        loads: list[tuple[int, str]] = []
        indexer.load_snapshot(path, digest, lambda donors, why, loads=loads: loads.append((donors, why)))
        indexer.hold(False)
        indexer.prune()
        assert late.drain(10)
        assert loads == [(0, reason)] and indexer.counters[f"snapshot:{reason}"] == 1
        assert {d for d in ("p1", "p2", "mine") if d in indexer.discovery} == late.resident("ns")
        late.close()
