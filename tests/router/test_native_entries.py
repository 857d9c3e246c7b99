"""The compiled entries (``_native/entries.c``) build exactly the entries the Python path builds from a sync page."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

from semblend_dynamo import native_entries
from semblend_dynamo.events.codec import decode, encode
from semblend_dynamo.events.schemas import DonorRegistration, DonorSyncPage, SyncRows
from semblend_dynamo.router import residency
from semblend_dynamo.router.residency import DonorEntry, Residency

pytestmark = pytest.mark.skipif(
    residency.NATIVE_ENTRIES is None, reason=f"compiled entries not used: {residency.NATIVE_ENTRIES_REASON}"
)


def _rows(count: int, *, codes: bool, dp_rank: int = 0) -> SyncRows:
    rng = np.random.default_rng(count)
    registrations = []
    for i in range(count):
        vector = rng.standard_normal(8).astype(np.float32)
        registrations.append(
            DonorRegistration(
                donor_id=f"donor-{i:04d}",
                donor_key=None if i % 5 == 0 else f"key-{i}",
                router_id=("router-a", "router-b")[i % 2],
                worker_id=(11, 22, 33)[i % 3],
                dp_rank=dp_rank,
                deployment="dep",
                namespace=("ns-a", "ns-b", "ns-c")[i % 3],
                num_tokens=(64, 100_000 + i)[i % 2],  # a small int shared, and ints of their own
                block_size=16,
                block_hashes=[1000 * i + k for k in range(4)],
                registered_at=10.0 + i / 7,
                embedding=(vector / np.linalg.norm(vector)).astype("<f2").tobytes(),
                embedding_dim=8,
            )
        )
    source = Residency(capacity=10_000, codes=codes)
    source.add_many(registrations)
    page = DonorSyncPage.of(
        source.entries(r.donor_id for r in registrations),
        router_id="p",
        deployment="dep",
        after=0,
        upto=None,
        next_cursor=None,
        last_cursor=count,
    )
    return decode(encode(page), DonorSyncPage, max_bytes=1 << 22).rows()


def _both(
    monkeypatch: pytest.MonkeyPatch,
    rows: SyncRows,
    picked: list[int] | range,
    codes: bool,
    ids: list[str] | None,
    slotted: bool = True,
) -> tuple[list[DonorEntry], list[DonorEntry], Residency, Residency]:
    built = []
    for native in (residency.NATIVE_ENTRIES, None):
        monkeypatch.setattr(residency, "NATIVE_ENTRIES", native)
        r = Residency(capacity=10_000, codes=codes)
        hashes: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        slots = range(3, 3 + len(picked)) if slotted else None
        entries = r._entries(rows, picked, slots, hashes, lengths, ids)
        built.append((entries, r, np.concatenate(hashes), np.concatenate(lengths)))
    (mine, r_mine, h_mine, l_mine), (theirs, r_theirs, h_theirs, l_theirs) = built
    assert np.array_equal(h_mine, h_theirs) and np.array_equal(l_mine, l_theirs)
    return mine, theirs, r_mine, r_theirs


@pytest.mark.parametrize("codes", [False, True])
@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("slotted", [False, True])
def test_the_compiled_entries_are_the_python_ones_slot_for_slot(
    monkeypatch: pytest.MonkeyPatch, codes: bool, with_ids: bool, slotted: bool
) -> None:
    rows = _rows(300, codes=codes)
    assert rows.row_sizes is not None
    picked = [5, 0, 7, 2, 299, 8, 9, 4, 1, *range(100, 200)]  # not a range: a chunk's rows of a page
    ids = [rows.donor_ids[i] for i in picked] if with_ids else None
    mine, theirs, r_mine, _ = _both(monkeypatch, rows, picked, codes, ids, slotted)
    assert len(mine) == len(theirs) == len(picked)
    for a, b in zip(mine, theirs, strict=True):
        assert type(a) is DonorEntry
        for name in DonorEntry.__slots__:
            assert getattr(a, name) == getattr(b, name), name
        for name in ("router_id", "deployment", "namespace", "block_size"):  # shared (interned) alike
            assert getattr(a, name) is getattr(b, name), name
        assert a.num_tokens is b.num_tokens or a.num_tokens > 4096  # small ints shared, others equal
        assert a.worker is r_mine._blocks(a.worker).key  # the residency's own worker key
        assert a.registration == b.registration and a.slot == b.slot
    assert [e.slot for e in mine] == (list(range(3, 3 + len(picked))) if slotted else [residency.NO_SLOT] * len(picked))
    assert [e.donor_id for e in mine] == [rows.donor_ids[i] for i in picked]


def test_the_entries_outlive_their_page_and_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows(50, codes=True)
    expected = [e.registration for e in _both(monkeypatch, rows, range(50), True, None)[1]]
    monkeypatch.setattr(
        residency,
        "NATIVE_ENTRIES",
        native_entries.load(native_entries.module_path(), (DonorEntry, residency.BLOB_HEAD))[0],
    )
    entries = Residency(capacity=100, codes=True)._entries(rows, range(50), range(50), [], [], None)
    del rows
    gc.collect()
    assert [e.registration for e in entries] == expected
    entry = entries[7]
    del entries
    gc.collect()
    assert entry.donor_id == "donor-0007" and sys.getrefcount(entry) == 2


def test_rows_of_rank_1_and_of_other_sizes_keep_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    native = residency.NATIVE_ENTRIES
    assert native is not None

    def counted(*args: object) -> object:
        calls.append(1)
        return native(*args)

    monkeypatch.setattr(residency, "NATIVE_ENTRIES", counted)
    r = Residency(capacity=1000, codes=True)
    r._entries(_rows(20, codes=True, dp_rank=1), range(20), range(20), [], [], None)
    assert not calls
    r._entries(_rows(20, codes=True), range(20), range(20, 40), [], [], None)
    assert calls == [1]


def test_inputs_it_does_not_take_raise_instead_of_building() -> None:
    native = residency.NATIVE_ENTRIES
    assert native is not None
    rows = _rows(4, codes=True)
    assert rows.row_sizes == (4, 8)
    keys = {11: (11, 0), 22: (22, 0), 33: (33, 0)}
    columns = (rows.donor_ids, rows.donor_keys, rows.router_ids, rows.worker_ids, keys, "dep", rows.namespaces)
    head = (*columns, rows.num_tokens, rows.block_sizes, sys.intern, residency._shared_int)
    parts = (rows.block_hashes, 4, rows.embeddings, 8, rows.registered_at, rows.embedding_dims, rows.embedding_codes)
    slots = np.arange(2, dtype=np.uint32)
    assert [e.donor_id for e in native([0, 3], None, *head, *parts, slots)] == ["donor-0000", "donor-0003"]
    with pytest.raises(IndexError):
        native([0, 4], None, *head, *parts, slots)  # past the page's rows
    with pytest.raises(ValueError):
        native([0, 1, 2], None, *head, *parts, slots)  # a slot each
    with pytest.raises(ValueError):
        native([0, 1], None, *head, *parts, slots.astype(np.uint64))
    with pytest.raises(ValueError):
        native([0, 1], None, *head, rows.block_hashes, 0, *parts[2:], slots)
    with pytest.raises(ValueError):
        native([0, 1], None, *head, rows.block_hashes, 4, rows.embeddings, 800, *parts[4:], slots)  # too few bytes
    with pytest.raises(KeyError):
        native([0, 1], None, *columns[:4], {}, *head[5:], *parts, slots)
    with pytest.raises(TypeError):
        native(range(2), None, *head, *parts, slots)
    with pytest.raises(TypeError):
        native([0, 1], None, *head, *parts[:4], ["x"] * 4, *parts[5:], slots)  # a stamp that is not a number


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native_entries.ENV, "0")
    assert native_entries.use((residency.DonorEntry, residency.BLOB_HEAD)) == (None, f"{native_entries.ENV}=0")


def test_status_says_what_residency_decided(capsys: pytest.CaptureFixture[str]) -> None:
    assert native_entries.main(["status"]) == 0
    used = "native" if residency.NATIVE_ENTRIES is not None else "python"
    assert capsys.readouterr().out == f"{used}: {residency.NATIVE_ENTRIES_REASON}\n"
