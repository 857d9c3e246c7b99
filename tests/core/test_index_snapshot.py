"""A usearch DonorIndex saved whole and loaded by another: the same donors, namespaces, vectors and answers; a file it
cannot take is refused with a reason and leaves the loading index as it was."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest

from semblend_dynamo import index_snapshot
from semblend_dynamo.config import IndexBackend
from semblend_dynamo.donor_index import DonorIndex, DonorIndexError, VectorDtype, usearch_available
from semblend_dynamo.index_snapshot import SnapshotError
from semblend_dynamo.vector_codes import i8_codes
from tests.core.test_donor_index import DIM, NS_A, NS_B, unit_rows

pytestmark = pytest.mark.skipif(not usearch_available(), reason="usearch not installed")


def _filled(dtype: VectorDtype = "i8", capacity: int = 1000) -> tuple[DonorIndex, dict[str, np.ndarray]]:
    """300 donors in two namespaces, two of them deleted again (their graph nodes stay behind as tombstones)."""
    index = DonorIndex(DIM, capacity, IndexBackend.USEARCH, dtype=dtype)
    rows = unit_rows(300, seed=3)
    vectors = {f"a{i}": rows[i] for i in range(200)} | {f"b{i}": rows[200 + i] for i in range(100)}
    index.insert_batch([f"a{i}" for i in range(200)], NS_A, rows[:200])
    index.insert_batch([f"b{i}" for i in range(100)], NS_B, rows[200:])
    for gone in ("a3", "b7"):
        assert index.delete(gone)
        del vectors[gone]
    return index, vectors


def _saved(index: DonorIndex, tmp_path: Path) -> Path:
    path = tmp_path / "index.snapshot"
    assert index.save_snapshot(path) == len(index)
    return path


@pytest.mark.parametrize("dtype", ["i8", "f16"])
def test_a_loaded_snapshot_answers_as_the_saved_index_and_takes_new_donors(tmp_path: Path, dtype: VectorDtype) -> None:
    saved, vectors = _filled(dtype)
    loaded = DonorIndex(DIM, 1000, IndexBackend.USEARCH, dtype=dtype)
    ids = loaded.load_snapshot(_saved(saved, tmp_path))

    assert sorted(ids) == sorted(vectors) and len(loaded) == len(saved) == 298
    assert loaded.namespaces() == saved.namespaces() and loaded.size(NS_B) == 99
    for donor_id in vectors:
        assert loaded.namespace_of(donor_id) == saved.namespace_of(donor_id)
        assert np.array_equal(loaded.vector(donor_id), saved.vector(donor_id))
    queries = unit_rows(20, seed=9)
    for query in queries:
        for namespace in (NS_A, NS_B):
            assert loaded.search(namespace, query, 8) == saved.search(namespace, query, 8)
    assert "a3" not in loaded and "b7" not in loaded

    # keys go on from the saved ones: a new donor collides with none, and namespaces stay apart
    fresh = unit_rows(2, seed=11)
    loaded.insert("new-a", NS_A, fresh[0])
    loaded.insert("new-c", "tenant-c", fresh[1])
    assert len(loaded) == 300 and loaded.namespace_of("new-a") == NS_A
    assert loaded.search(NS_A, fresh[0], 1)[0].donor_id == "new-a"
    assert [h.donor_id for h in loaded.search("tenant-c", fresh[0], 8)] == ["new-c"]
    assert loaded.delete("a5") and loaded.delete("new-a") and len(loaded) == 298


def test_holds_says_which_donors_are_indexed_in_the_namespace_with_the_embedding_kept(tmp_path: Path) -> None:
    for dtype in ("i8", "f16"):
        saved, vectors = _filled(dtype)
        loaded = DonorIndex(DIM, 1000, IndexBackend.USEARCH, dtype=dtype)
        loaded.load_snapshot(_saved(saved, tmp_path))

        def kept(vector: np.ndarray, dtype: str = dtype) -> bytes:  # as a catalog keeps an embedding
            return i8_codes(vector.reshape(1, -1))[0][0].tobytes() if dtype == "i8" else vector.astype("<f2").tobytes()

        other = kept(unit_rows(1, seed=5)[0])
        ids = ["a1", "a2", "b1", "a3", "unknown", "a4"]
        embeddings = [kept(vectors["a1"]), other, kept(vectors["b1"]), kept(vectors["a1"]), other, None]
        assert loaded.holds(ids, NS_A, embeddings) == [True, False, False, False, False, False]
        assert loaded.holds(["b1"], NS_B, [kept(vectors["b1"])]) == [True]
        assert loaded.holds(["a1"], "no-such-namespace", [kept(vectors["a1"])]) == [False]
        if dtype == "i8":  # read back as stored: the codes a catalog keeps
            assert loaded.stored_embeddings(["a1", "b1", "a3"]) == [kept(vectors["a1"]), kept(vectors["b1"]), None]
        assert loaded.stored_embeddings(["a1", "b1"], NS_B)[0] is None


@pytest.mark.parametrize("dtype", ["i8", "f16"])
def test_a_read_back_of_one_namespace_reads_what_a_mixed_one_reads(dtype: VectorDtype) -> None:
    """A page's usual read-back (every donor indexed, one namespace) takes one call for all; it reads the same rows as
    a read-back that mixes namespaces and unknown donors, and the namespace filter still applies."""
    index, vectors = _filled(dtype)
    ids = [f"a{i}" for i in range(40) if i != 3]
    alone = index.stored_embeddings(ids)
    mixed = index.stored_embeddings([*ids, "b1", "unknown"])
    assert alone == mixed[: len(ids)] and mixed[-1] is None and all(row is not None for row in alone)
    assert len({row for row in alone}) == len(ids)  # each donor its own row
    assert index.stored_embeddings(ids, NS_A) == alone
    assert index.stored_embeddings(ids, NS_B) == [None] * len(ids)
    if dtype == "i8":
        assert alone[0] == i8_codes(vectors["a0"].reshape(1, -1))[0][0].tobytes()


def _refused(loaded: DonorIndex, path: Path, reason: str) -> None:
    before = (len(loaded), loaded.namespaces())
    with pytest.raises(SnapshotError) as raised:
        loaded.load_snapshot(path)
    assert raised.value.reason == reason
    assert (len(loaded), loaded.namespaces()) == before


def test_an_index_that_holds_donors_or_is_too_small_or_built_otherwise_refuses_a_snapshot(tmp_path: Path) -> None:
    saved, _ = _filled()
    path = _saved(saved, tmp_path)
    busy = DonorIndex(DIM, 1000, IndexBackend.USEARCH)
    busy.insert("mine", NS_A, unit_rows(1)[0])
    _refused(busy, path, "not_empty")
    _refused(DonorIndex(DIM, 297, IndexBackend.USEARCH), path, "over_capacity")
    _refused(DonorIndex(DIM, 1000, IndexBackend.USEARCH, dtype="f16"), path, "incompatible")
    _refused(DonorIndex(DIM * 2, 1000, IndexBackend.USEARCH), path, "incompatible")
    _refused(DonorIndex(DIM, 1000, IndexBackend.USEARCH, connectivity=8), path, "incompatible")
    numpy_index = DonorIndex(DIM, 1000, IndexBackend.NUMPY)
    _refused(numpy_index, path, "incompatible")
    with pytest.raises(DonorIndexError):
        numpy_index.save_snapshot(tmp_path / "numpy.snapshot")


def _rewritten(path: Path, edit) -> Path:
    """The snapshot with its description edited by ``edit`` (blobs as they were)."""
    data = path.read_bytes()
    length, magic = struct.unpack("<Q8s", data[-16:])
    description = msgpack.unpackb(data[-16 - length : -16])
    edit(description)
    packed = msgpack.packb(description)
    out = path.with_suffix(".edited")
    out.write_bytes(data[: -16 - length] + packed + struct.pack("<Q8s", len(packed), magic))
    return out


def _first(key: str, value: object):
    def edit(description: dict) -> None:
        description["sections"][0][key] = value

    return edit


def test_a_damaged_or_forged_snapshot_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    saved, _ = _filled()
    path = _saved(saved, tmp_path)
    data = path.read_bytes()
    loaded = DonorIndex(DIM, 1000, IndexBackend.USEARCH)
    damaged = {
        "truncated": data[: len(data) // 2],
        "no tail": data[:-16],
        "too short": b"x",
        "garbage description": data[:-16] + struct.pack("<Q8s", 16, index_snapshot.MAGIC),
    }
    for name, content in damaged.items():
        bad = tmp_path / name.replace(" ", "_")
        bad.write_bytes(content)
        _refused(loaded, bad, "bad_snapshot")

    sections = msgpack.unpackb(data[-16 - struct.unpack("<Q8s", data[-16:])[0] : -16])["sections"]
    keys_at, ids_at, index_at = (sections[0][blob] for blob in ("keys", "ids", "index"))
    forged = {
        "a count the keys do not have": _first("count", sections[0]["count"] + 1),
        "another namespace's key bits": _first("slot", sections[1]["slot"]),
        "key bits out of range": _first("slot", 1 << 30),
        "a blob past the end": _first("index", [index_at[0], len(data)]),
        "ids read from the keys": _first("ids", keys_at),
        "keys read from the ids": _first("keys", [ids_at[0], keys_at[1]]),
        "a graph of the other section": _first("index", sections[1]["index"]),
        "one namespace twice": _first("namespace", sections[1]["namespace"]),
        "no sections": lambda d: d.pop("sections"),
    }
    for name, edit in forged.items():
        with pytest.raises(SnapshotError) as raised:
            loaded.load_snapshot(_rewritten(path, edit))
        assert raised.value.reason == "bad_snapshot", name
        assert len(loaded) == 0 and loaded.namespaces() == [], name
    assert len(loaded.load_snapshot(path)) == 298  # and the real one still loads


def test_the_digest_names_the_bytes(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.write_bytes(b"a" * 5_000_000)
    two.write_bytes(b"a" * 4_999_999 + b"b")
    assert index_snapshot.file_digest(one) != index_snapshot.file_digest(two)
    assert len(index_snapshot.file_digest(one)) == 32
