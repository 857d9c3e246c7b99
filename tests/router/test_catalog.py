"""DonorCatalog: the one owner of the router's donors keeps catalog, residency and the pipeline equal."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.codec import decode, encode
from semblend_dynamo.events.schemas import DonorRegistration, DonorSyncPage, KvEvent, KvRemoved
from semblend_dynamo.router.__main__ import build_discovery
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.residency import sync_row_bytes
from semblend_dynamo.router.u64map import U64Map
from semblend_dynamo.vector_codes import i8_codes
from tests.support.catalog_donors import W1
from tests.support.catalog_donors import registration as _donor
from tests.support.catalog_donors import stored as _stored
from tests.support.small_maps import small_block_maps


def _catalog(capacity: int = 100) -> tuple[DonorCatalog, int]:
    discovery = build_discovery(SemblendConfig(block_size=16, embedder="hash"))
    assert discovery is not None and discovery.index is not None
    return DonorCatalog(capacity, discovery), discovery.index.dim


def _codes(registration: DonorRegistration) -> bytes:
    """The int8 codes an i8 index keeps of a registration's embedding."""
    codes, ok = i8_codes(registration.vector().reshape(1, -1))
    assert ok.all()
    return codes[0].tobytes()


def test_a_peer_donor_enters_the_pipeline_only_while_resident() -> None:
    catalog, dim = _catalog()
    discovery = catalog.indexer.discovery if catalog.indexer else None
    assert discovery is not None and discovery.index is not None
    assert catalog.add(_donor("peer", [1, 2], dim))
    assert "peer" in catalog and "peer" not in discovery.index
    catalog.apply_kv_events([_stored(1, 1, 2)])
    assert catalog.resident_donor("peer") is not None  # the catalog at once; the pipeline once the indexer ran
    assert catalog.drain(10) and "peer" in discovery and "peer" in discovery.index
    catalog.apply_kv_events([KvEvent(W1, 2, KvRemoved([1001]))])
    assert "peer" not in catalog
    assert catalog.drain(10) and "peer" not in discovery and "peer" not in discovery.index
    assert catalog.changed


def test_older_copies_are_ignored_and_capacity_evicts_from_the_pipeline_too() -> None:
    catalog, dim = _catalog(capacity=2)
    discovery = catalog.indexer.discovery if catalog.indexer else None
    assert discovery is not None
    catalog.apply_kv_events([_stored(1, 1, 2, 3)])
    assert catalog.add(_donor("a", [1], dim, registered_at=5.0))
    assert not catalog.add(_donor("a", [1], dim, registered_at=4.0))
    catalog.add(_donor("b", [2], dim))
    catalog.add(_donor("c", [3], dim))
    assert (
        catalog.drain(10) and "a" not in catalog and "a" not in discovery and {"b", "c"} <= set(catalog.resident("ns"))
    )
    assert catalog.forget("b") and not catalog.forget("b") and catalog.drain(10) and "b" not in discovery


def test_pages_cover_every_donor_once_while_the_catalog_changes() -> None:
    catalog, dim = _catalog(capacity=1000)
    for i in range(25):
        catalog.add(_donor(f"d{i:02d}", [i + 1], dim))
    seen: list[str] = []
    page = catalog.page(0, 10)
    seen += [r.donor_id for r in page.entries]
    catalog.forget("d15")
    catalog.add(_donor("late", [99], dim))
    while page.more:
        page = catalog.page(page.cursors[-1], 10)
        seen += [r.donor_id for r in page.entries]
    assert len(seen) == len(set(seen)) == 25  # 24 originals (d15 left) + the late one
    assert "d15" not in seen and "late" in seen


def test_concurrent_writers_and_readers_keep_catalog_and_pipeline_equal() -> None:
    catalog, dim = _catalog(capacity=10_000)
    discovery = catalog.indexer.discovery if catalog.indexer else None
    assert discovery is not None
    catalog.apply_kv_events([_stored(1, *range(1, 401))])
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for i in range(200):
                catalog.add(_donor(f"w{offset}-{i}", [offset * 200 + i + 1], dim))
                if i % 3 == 0:
                    catalog.forget(f"w{offset}-{i}")
                catalog.page(0, 50)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and catalog.drain(10)
    known = {f"w{k}-{i}" for k in range(2) for i in range(200) if i % 3}
    assert {d for d in known if d in catalog} == known and len(catalog) == len(known) == len(discovery)


def test_add_many_ends_where_adding_one_by_one_ends() -> None:
    one, dim = _catalog(capacity=50)
    many, _ = _catalog(capacity=50)
    for catalog in (one, many):
        catalog.apply_kv_events([_stored(1, *range(1, 40))])  # donors on hashes 40.. are not resident
    registrations = [_donor(f"d{i % 60}", [i % 70 + 1, 3], dim, registered_at=float(i)) for i in range(80)]
    registrations += [_donor("d5", [5], dim, registered_at=1.0)]  # an older copy: ignored
    nan = _donor("nan", [7], dim)
    registrations.append(nan.model_copy(update={"embedding": b"\xff\x7f" * dim}))  # NaN: resident, not indexed
    for registration in registrations:
        one.add(registration)
    assert many.add_many(registrations[:30]) == 30 and many.add_many(registrations[30:]) == len(registrations) - 31
    assert one.snapshot() == many.snapshot() and len(one) == 50
    assert one.resident("ns") == many.resident("ns") and "nan" in many.resident("ns")
    for catalog in (one, many):
        assert catalog.drain(10)
        discovery = catalog.indexer.discovery if catalog.indexer else None
        assert discovery is not None and discovery.index is not None
        assert set(catalog.resident("ns")) - {"nan"} == {d for d in catalog.resident("ns") if d in discovery.index}
        assert discovery.counters["donor_embedding_errors"] == 1
    order = [_order(catalog) for catalog in (one, many)]
    assert order[0] == order[1] and len(order[0]) == 50


def test_a_sync_pages_rows_end_where_its_registrations_added_one_by_one_end() -> None:
    """``add_rows`` (the sync page's columns, in chunks) against ``add`` of the page's registrations: the same
    catalog, resident sets, cursor order and pipeline; rows of the replica's own router and older copies are left
    out."""
    one, dim = _catalog(capacity=50)
    rows, _ = _catalog(capacity=50)
    for catalog in (one, rows):
        catalog.apply_kv_events([_stored(1, *range(1, 40))])
        catalog.add(_donor("known", [2], dim, registered_at=5.0))
    registrations = [_donor(f"d{i}", [i % 70 + 1, 3], dim, registered_at=float(i)) for i in range(60)]
    registrations += [_donor("known", [4], dim, registered_at=4.0)]  # older than the catalog's copy
    registrations += [_donor("mine", [6], dim).model_copy(update={"router_id": "me"})]
    page = DonorSyncPage.of(
        registrations, router_id="peer", deployment="d", after=0, upto=None, next_cursor=None, last_cursor=62
    )
    columns = decode(encode(page), DonorSyncPage, max_bytes=1 << 20).rows()
    every, _ = _catalog(capacity=100)
    assert every.add_rows([(columns, range(len(columns)))]) == len(columns)  # no router skipped (their own is "")
    assert rows.add_rows([(columns, range(25))], skip_router="me") == 25
    parts = [(columns, range(25, 27)), (columns, [27, 28, 29]), (columns, range(30, 62))]
    assert rows.add_rows(parts, skip_router="me") == 35
    for registration in registrations[:60]:
        one.add(registration)
    assert one.snapshot() == rows.snapshot() and len(rows) == 50 and "mine" not in rows
    assert one.resident("ns") == rows.resident("ns")
    order = [_order(catalog) for catalog in (one, rows)]
    assert order[0] == order[1]
    for catalog in (one, rows):
        assert catalog.drain(10)
        index = catalog.indexer.discovery.index if catalog.indexer else None
        assert index is not None and all(d in index for d in catalog.resident("ns"))
    entry = rows.resident_donor("d10")
    assert entry is not None and entry.embedding_codes  # the catalog's index is i8: its donors keep the codes


def test_a_sync_add_of_new_donors_queues_for_the_index_exactly_those_it_made_resident() -> None:
    """A page's new donors (nothing replaced or evicted: the pipeline takes them from the entries taken, not by id)
    enter the search index only when resident, as when added one by one; the others join once their blocks arrive."""
    rows_catalog, dim = _catalog(capacity=100)
    one, _ = _catalog(capacity=100)
    for catalog in (rows_catalog, one):
        catalog.apply_kv_events([_stored(1, *range(1, 21))])  # blocks 1-20 stored on W1
    registrations = [_donor(f"d{i}", [i + 1, i + 2], dim, registered_at=float(i)) for i in range(30)]  # d19-d29 not
    page = DonorSyncPage.of(
        registrations, router_id="peer", deployment="d", after=0, upto=None, next_cursor=None, last_cursor=30
    )
    columns = decode(encode(page), DonorSyncPage, max_bytes=1 << 20).rows()
    assert rows_catalog.add_rows([(columns, range(30))]) == 30
    for registration in registrations:
        one.add(registration)
    for catalog in (rows_catalog, one):
        assert catalog.drain(10)
        discovery = catalog.indexer.discovery if catalog.indexer else None
        assert discovery is not None and discovery.index is not None
        assert {f"d{i}" for i in range(30) if f"d{i}" in discovery.index} == {f"d{i}" for i in range(19)}
        catalog.apply_kv_events([_stored(2, *range(21, 32))])
        assert catalog.drain(10) and all(f"d{i}" in discovery.index for i in range(30))
    # resident donors whose embedding the index cannot take (another size; none) are not queued, on a page of one
    # size as on a mixed one
    other = [_donor(f"o{i}", [i + 1], dim // 2) for i in range(5)] + [_donor(f"z{i}", [i + 1], 0) for i in range(5)]
    mixed = [_donor(f"m{i}", [i + 1], dim) for i in range(5)] + [_donor(f"n{i}", [i + 1], dim // 2) for i in range(5)]
    indexer = rows_catalog.indexer
    assert indexer is not None
    queued: list[str] = []
    add_peers = indexer.add_peers
    indexer.add_peers = lambda donors: queued.extend(d.donor_id for d in donors) or add_peers(donors)  # type: ignore[method-assign]
    for group in (other[:5], other[5:], mixed):
        page = DonorSyncPage.of(
            group, router_id="peer", deployment="d", after=0, upto=None, next_cursor=None, last_cursor=len(group)
        )
        columns = decode(encode(page), DonorSyncPage, max_bytes=1 << 20).rows()
        assert rows_catalog.add_rows([(columns, range(len(group)))]) == len(group)
    assert rows_catalog.drain(10)
    index = rows_catalog.indexer.discovery.index if rows_catalog.indexer else None
    assert index is not None and all(r.donor_id in rows_catalog for r in other + mixed)
    assert {r.donor_id for r in other + mixed if r.donor_id in index} == {f"m{i}" for i in range(5)}
    assert queued == [f"m{i}" for i in range(5)]  # the others not even queued


def test_an_indexed_donor_keeps_no_embedding_copy_and_its_page_reads_it_back_from_the_index() -> None:
    catalog, dim = _catalog()
    sent = [_donor("indexed", [1, 2], dim), _donor("waiting", [50], dim)]
    catalog.add_many(sent)
    catalog.apply_kv_events([_stored(1, 1, 2)])
    indexed = catalog.resident_donor("indexed")
    assert catalog.drain(10)
    assert indexed is not None and indexed.own_embedding is None  # the index holds it (once the indexer applied it)
    page = catalog.page(0, 10)
    assert [e.donor_id for e in page.entries] == ["indexed", "waiting"] and not page.more
    assert page.embeddings == [_codes(sent[0]), None]  # read back from the index: the same codes; its own copy
    columns = page.columns()
    assert columns.embeddings == _codes(sent[0]) + _codes(sent[1])  # both as the i8 index keeps them
    assert columns.block_hashes == np.array([1, 2, 50], dtype="<u8").tobytes()
    assert page.columns(1).donor_ids == ["indexed"]
    waiting = catalog.resident_donor("waiting") or catalog._residency.donor("waiting")
    assert waiting is not None
    waiting.drop_embedding()  # as the indexer's thread does once it indexed a donor, after the page was taken
    assert page.columns() == columns  # the page reads the blobs it was taken with


def test_a_page_ends_within_its_bytes_and_a_donor_past_them_goes_alone() -> None:
    catalog, dim = _catalog(capacity=1000)
    catalog.add_many(
        [_donor(f"d{i:02d}", list(range(100 * i + 1, 100 * i + 2 + 20 * (i == 3))), dim) for i in range(8)]
    )
    sizes = sync_row_bytes(catalog.page(0, 100).entries)
    page = catalog.page(0, 100, max_bytes=sum(sizes[:2]) + 1)
    assert [e.donor_id for e in page.entries] == ["d00", "d01"] and page.more
    page = catalog.page(page.cursors[-1], 100, max_bytes=sizes[2] + sizes[3] - 1)  # d03 is the largest
    assert [e.donor_id for e in page.entries] == ["d02"] and page.more
    page = catalog.page(page.cursors[-1], 100, max_bytes=sizes[3] - 1)
    assert [e.donor_id for e in page.entries] == ["d03"] and page.more  # alone, past the bytes
    page = catalog.page(page.cursors[-1], 3)
    assert [e.donor_id for e in page.entries] == ["d04", "d05", "d06"] and page.more
    assert len(catalog.page(page.cursors[-1], 3)) == 1 and not catalog.page(page.cursors[-1], 3).more


def _order(catalog: DonorCatalog) -> list[tuple[int, str]]:
    page = catalog.page(0, 100)
    return [(seq, entry.donor_id) for seq, entry in zip(page.cursors, page.entries, strict=True)]


class _StalledResidencyAdd:
    """Test double: the catalog's residency stops inside ``add_many`` (the catalog's lock held, nothing changed yet)
    until released, as a registration's add does while the donor thread rewrites a block map."""

    def __init__(self, catalog: DonorCatalog) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released = False  # by the test, not by the deadlock guard's timeout
        residency = catalog._residency
        add_many = residency.add_many

        def stalled(registrations):  # type: ignore[no-untyped-def]
            self.entered.set()
            self.released = self.release.wait(10)
            return add_many(registrations)

        residency.add_many = stalled  # type: ignore[method-assign]


def test_a_read_of_another_donor_does_not_wait_for_a_registration_being_added() -> None:
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1, 2, 3)])
    catalog.add(_donor("b", [2], dim))
    b = catalog.resident_donor("b")
    assert b is not None
    stall = _StalledResidencyAdd(catalog)
    writer = threading.Thread(target=catalog.add, args=(_donor("a", [3], dim),))
    writer.start()
    assert stall.entered.wait(10)
    seen = catalog.resident_donor("b"), catalog.resident_donor("c")  # while the donor thread holds the lock
    stall.release.set()
    writer.join(10)
    assert stall.released, "the read waited for the registration being added"
    assert seen == (b, None)
    assert catalog.resident_donor("a") is not None


def test_a_read_of_the_donor_being_added_waits_for_the_add() -> None:
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1, 3)])
    catalog.add(_donor("a", [1], dim, registered_at=1.0))
    stall = _StalledResidencyAdd(catalog)
    writer = threading.Thread(target=catalog.add, args=(_donor("a", [3], dim, registered_at=2.0),))
    writer.start()
    assert stall.entered.wait(10)
    seen = []
    reader = threading.Thread(target=lambda: seen.append(catalog.resident_donor("a")))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not seen  # it waits for the add (the old copy is being replaced)
    stall.release.set()
    writer.join(10)
    reader.join(10)
    assert stall.released and len(seen) == 1 and seen[0] is not None and seen[0].registered_at == 2.0


def test_a_read_waits_while_another_thread_applies_kv_events() -> None:
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1)])
    catalog.add(_donor("a", [1], dim))
    entered, release = threading.Event(), threading.Event()
    apply = catalog._residency.apply

    def stalled(event):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(10)
        apply(event)

    catalog._residency.apply = stalled  # type: ignore[method-assign]
    writer = threading.Thread(target=catalog.apply_kv_events, args=([KvEvent(W1, 2, KvRemoved([1001]))],))
    writer.start()
    assert entered.wait(10)
    seen = []
    reader = threading.Thread(target=lambda: seen.append(catalog.resident_donor("a")))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not seen  # residency may be changing anywhere: the read waits
    release.set()
    writer.join(10)
    reader.join(10)
    assert seen == [None]


def test_the_exact_wins_gate_does_not_wait_for_a_registration_being_added() -> None:
    """The gate reads the block maps without the lock while the donor thread holds it (the maps are not changing)."""
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1, 2, 3)])
    stall = _StalledResidencyAdd(catalog)
    writer = threading.Thread(target=catalog.add, args=(_donor("a", [3, 4], dim),))
    writer.start()
    assert stall.entered.wait(10)
    seen = catalog.stored_together([1, 3]), catalog.stored_together([1, 5])  # while the donor thread holds the lock
    stall.release.set()
    writer.join(10)
    assert stall.released, "the gate waited for the registration being added"
    assert seen == (True, False)
    assert catalog.gate_unsure == 0


def test_the_exact_wins_gate_says_it_does_not_know_while_a_block_map_it_reads_is_changing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block map changing on another thread (the donor thread posting a registration's hashes on it) cannot be
    read: the gate does not wait for the change, it answers None (not known; counted)."""
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1, 2, 3)])
    assert catalog.stored_together([1, 5]) is False
    entered, release = threading.Event(), threading.Event()
    released: list[bool] = []
    changed = U64Map._changed

    def stalled_change(self: U64Map) -> None:  # the writer's change, stopped half way (the map busy, the lock held)
        if threading.current_thread() is writer:
            entered.set()
            released.append(release.wait(10))
        changed(self)

    monkeypatch.setattr(U64Map, "_changed", stalled_change)
    writer = threading.Thread(target=catalog.add, args=(_donor("a", [3, 4], dim),))
    writer.start()
    assert entered.wait(10)
    seen = catalog.stored_together([1, 5])
    release.set()
    writer.join(10)
    assert released == [True], "the gate waited for the block map's change"
    assert seen is None and catalog.gate_unsure == 1
    assert catalog.stored_together([1, 5]) is False and catalog.stored_together([1, 3]) is True


def _flushed(catalog: DonorCatalog) -> int:
    """Flush the queued kv-events as the router does, again while another thread (the indexer) holds the lock."""
    gaps = catalog.flush_kv_events()
    for _ in range(1000):
        if not catalog.kv_queued:
            break
        threading.Event().wait(0.002)
        gaps += catalog.flush_kv_events()
    return gaps


def test_kv_events_do_not_wait_for_another_threads_write_and_are_applied_in_order_after_it() -> None:
    """The event loop applies kv-events; while the donor thread holds the lock (a registration's add) a batch is
    queued instead of waited for. The add leaves it queued (its hold stays its own work); the next flush applies the
    queued batches in arrival order."""
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1, 2)])
    catalog.add(_donor("b", [1, 2], dim))
    stall = _StalledResidencyAdd(catalog)
    writer = threading.Thread(target=catalog.add, args=(_donor("a", [3], dim),))
    writer.start()
    assert stall.entered.wait(10)
    gaps = catalog.apply_kv_events([_stored(2, 3, 4)]), catalog.apply_kv_events([KvEvent(W1, 3, KvRemoved([1002]))])
    stall.release.set()
    writer.join(10)
    assert stall.released, "a kv-event waited for the registration being added"
    assert gaps == (0, 0) and catalog.kv_queued  # not applied by the add
    assert _flushed(catalog) == 0 and not catalog.kv_queued
    assert catalog.resident_donor("a") is not None  # its block stored by the first queued batch
    assert catalog.resident_donor("b") is None  # one of its blocks removed by the second, after the first
    assert catalog.stored_together([3, 4]) and not catalog.stored_together([2])


def test_queued_kv_events_are_applied_before_the_next_batch_and_before_other_writes() -> None:
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1, 2)])
    stall = _StalledResidencyAdd(catalog)
    writer = threading.Thread(target=catalog.add, args=(_donor("a", [1], dim),))
    writer.start()
    assert stall.entered.wait(10)
    catalog.apply_kv_events([KvEvent(W1, 2, KvRemoved([1001]))])
    stall.release.set()
    writer.join(10)
    assert stall.released and catalog.kv_queued
    catalog.apply_kv_events([_stored(3, 1)])  # the queued removal first, then this store: block 1 stored again
    _flushed(catalog)  # (had the indexer thread held the lock just then, this one was queued behind it)
    assert not catalog.kv_queued and catalog.stored_together([1, 2])
    stall = _StalledResidencyAdd(catalog)
    writer = threading.Thread(target=catalog.add, args=(_donor("c", [5], dim),))
    writer.start()
    assert stall.entered.wait(10)
    catalog.apply_kv_events([KvEvent(W1, 4, KvRemoved([1001]))])
    stall.release.set()
    writer.join(10)
    assert catalog.kv_queued
    assert catalog.forget("c") and not catalog.kv_queued  # a write of the loop applies what is queued first
    assert not catalog.stored_together([1])


def test_gaps_found_by_queued_kv_events_are_reported_when_they_are_applied() -> None:
    catalog, dim = _catalog()
    catalog.apply_kv_events([_stored(1, 1)])
    stall = _StalledResidencyAdd(catalog)
    writer = threading.Thread(target=catalog.add, args=(_donor("a", [3], dim),))
    writer.start()
    assert stall.entered.wait(10)
    queued = catalog.apply_kv_events([_stored(5, 3)])  # ids 2-4 missed: a gap, found once the batch is applied
    stall.release.set()
    writer.join(10)
    assert stall.released and queued == 0
    assert _flushed(catalog) == 1 and catalog.flush_kv_events() == 0
    assert catalog.apply_kv_events([_stored(6, 6)]) == 0 and catalog.event_gaps == 1


def test_settling_the_block_maps_finishes_their_rewrites_and_changes_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kv-events that stop mid-rewrite leave block maps holding two bases; ``settle_maps`` writes the rest a bounded
    slice per call, the catalog reads the same throughout, and it never waits for the lock (None while another
    thread holds it, nothing written)."""
    small_block_maps(monkeypatch)
    catalog, dim = _catalog(capacity=5_000)
    for first in range(1, 3_001, 100):
        hashes = list(range(first, first + 100))
        catalog.add_many(_donor(f"d{h}", [h], dim) for h in hashes)
        catalog.apply_kv_events([_stored(first, *hashes)])
    # a batch that found the lock held by the indexer's thread waits in the queue (the router flushes it 1 ms later)
    assert catalog.drain(10)
    catalog.flush_kv_events()
    assert not catalog.kv_queued
    maps = [m for blocks in catalog._residency._workers.values() for m in (blocks.by_block, blocks.hashes)]
    assert any(m.rewriting for m in maps)
    before, left = catalog.snapshot(), sum(m.rewrite_left for m in maps)
    catalog._lock.acquire()
    try:
        assert _other_thread(lambda: catalog.settle_maps(100)) is None
    finally:
        catalog._lock.release()
    assert sum(m.rewrite_left for m in maps) == left
    while True:
        frozen = sum(len(m._frozen_keys) for m in maps)
        settled = catalog.settle_maps(100)
        assert settled is not None
        written, now = settled
        assert now == left - written and now == sum(m.rewrite_left for m in maps)
        assert 0 < written <= 100 + frozen  # 100 base entries at most, and the frozen entries of their ranges
        left = now
        assert catalog.stored_together([1, 2, 2_999]) and catalog.is_resident("d1500")
        if not now:
            break
    assert not any(m.rewriting for m in maps) and catalog.settle_maps(100) == (0, 0)
    assert catalog.snapshot() == before and len(catalog.resident("ns")) == 3_000
    catalog.close()


def _other_thread(call: object) -> object:
    """What ``call()`` returns on another thread."""
    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(call()))  # type: ignore[operator]
    worker.start()
    worker.join(10)
    return out[0]
