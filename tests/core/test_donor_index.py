"""DonorIndex on both backends (usearch with f16 and i8 storage): results against a brute-force oracle, namespaces, LRU
capacity, bad input, the stored vector read back."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest

from semblend_dynamo import donor_index
from semblend_dynamo.config import ConfigError, IndexBackend, SemblendConfig
from semblend_dynamo.donor_index import (
    AUTO_NUMPY_MAX_CAPACITY,
    DonorHit,
    DonorIndex,
    DonorIndexError,
    VectorDtype,
    quantize_i8,
    resolve_backend,
    usearch_available,
)
from semblend_dynamo.events.schemas import DonorRegistration
from semblend_dynamo.namespace import NamespaceKey

DIM = 32
NS_A = NamespaceKey(model_id="m", tokens_per_block=32).digest()
NS_B = NamespaceKey(model_id="m", tokens_per_block=32, cache_salt="tenant-b").digest()


def unit_rows(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(vectors: dict[str, np.ndarray], query: np.ndarray, k: int) -> list[str]:
    """The oracle: exact cosine ranking over a plain dict."""
    q = query / np.linalg.norm(query)
    return sorted(vectors, key=lambda d: -float(vectors[d] @ q))[:k]


@dataclass(frozen=True)
class Storage:
    """A backend and, for usearch, its vector storage; ``tolerance`` bounds a hit's similarity error at DIM dims."""

    backend: IndexBackend
    dtype: VectorDtype = "f16"
    tolerance: float = 1e-5

    def index(self, capacity: int, dim: int = DIM) -> DonorIndex:
        return DonorIndex(dim, capacity, self.backend, dtype=self.dtype)


STORAGES = [
    Storage(IndexBackend.NUMPY),
    Storage(IndexBackend.USEARCH, "f16", 2e-3),
    Storage(IndexBackend.USEARCH, "i8", 1e-2),  # per-vector int8 codes; at 384 dims the error is below 3e-3
]


@pytest.fixture(
    params=STORAGES, ids=lambda s: s.backend.value if s.backend is IndexBackend.NUMPY else f"usearch-{s.dtype}"
)
def storage(request: pytest.FixtureRequest) -> Storage:
    if request.param.backend is IndexBackend.USEARCH and not usearch_available():
        pytest.skip("usearch not installed")
    return request.param


def test_search_matches_brute_force_oracle(storage: Storage) -> None:
    index = storage.index(1000)
    vectors = unit_rows(300)
    stored = {f"d{i}": v for i, v in enumerate(vectors)}
    for donor_id, v in stored.items():
        assert index.insert(donor_id, NS_A, v) == []
    queries = unit_rows(20, seed=1)
    agree = 0
    for q in queries:
        hits = index.search(NS_A, q, 5)
        assert [h.similarity for h in hits] == sorted((h.similarity for h in hits), reverse=True)
        agree += len({h.donor_id for h in hits} & set(brute_force(stored, q, 5)))
        for h in hits:
            assert h.similarity == pytest.approx(float(stored[h.donor_id] @ q), abs=storage.tolerance)
    assert agree / (20 * 5) >= (1.0 if storage.backend is IndexBackend.NUMPY else 0.95)


def test_nearest_neighbour_of_a_stored_vector_is_itself(storage: Storage) -> None:
    index = storage.index(100)
    vectors = unit_rows(50)
    index.insert_batch([f"d{i}" for i in range(50)], NS_A, vectors)
    for i in (0, 17, 49):
        top = index.search(NS_A, vectors[i] * 3.0, 1)[0]  # queries are normalised
        assert top.donor_id == f"d{i}" and top.similarity == pytest.approx(1.0, abs=1e-3)


def test_namespaces_never_cross(storage: Storage) -> None:
    index = storage.index(100)
    v = unit_rows(2)
    index.insert("tenant-a-donor", NS_A, v[0])
    index.insert("tenant-b-donor", NS_B, v[1])
    assert [h.donor_id for h in index.search(NS_A, v[1], 8)] == ["tenant-a-donor"]
    assert [h.donor_id for h in index.search(NS_B, v[0], 8)] == ["tenant-b-donor"]
    assert index.namespaces() == sorted([NS_A, NS_B])
    assert index.size(NS_A) == index.size(NS_B) == 1


def test_unknown_namespace_is_an_empty_result_not_an_error(storage: Storage) -> None:
    index = storage.index(10)
    assert index.search("no-such-namespace", unit_rows(1)[0], 8) == []
    assert index.size("no-such-namespace") == 0
    index.insert("d", NS_A, unit_rows(1)[0])
    assert index.search(NS_B, unit_rows(1)[0], 8) == []


def test_capacity_overflow_evicts_least_recently_used(storage: Storage) -> None:
    index = storage.index(3)
    v = unit_rows(5)
    for i in range(3):
        assert index.insert(f"d{i}", NS_A if i % 2 else NS_B, v[i]) == []
    # a search hit on d0 makes d1 the least recently used
    assert index.search(NS_B, v[0], 1)[0].donor_id == "d0"
    assert index.insert("d3", NS_A, v[3]) == ["d1"]
    assert index.insert("d4", NS_A, v[4]) == ["d2"]
    assert len(index) == 3 and "d1" not in index and "d0" in index
    assert {h.donor_id for h in index.search(NS_A, v[1], 8)} == {"d3", "d4"}


def test_a_namespace_emptied_gives_its_key_bits_to_the_next_and_searches_never_cross(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's low bits name its namespace (no map from key to namespace); an emptied namespace's bits go to the next
    new one, and past the limit of namespaces at once an insert is refused, leaving the index as it was."""
    monkeypatch.setattr(donor_index, "MAX_NAMESPACES", 2)
    index = storage.index(10)
    v = unit_rows(4)
    index.insert("a", NS_A, v[0])
    index.insert("b", NS_B, v[1])
    ns_c = NamespaceKey(model_id="m", tokens_per_block=32, cache_salt="tenant-c").digest()
    with pytest.raises(DonorIndexError, match="namespaces"):
        index.insert("b", ns_c, v[2])  # b moving to a third namespace: refused, b stays where it was
    assert len(index) == 2 and index.namespaces() == sorted([NS_A, NS_B]) and index.namespace_of("b") == NS_B
    assert index.delete("a")
    index.insert("c", ns_c, v[2])  # NS_A's bits, now ns_c's
    assert index.namespace_of("c") == ns_c and index.namespace_of("b") == NS_B
    assert [h.donor_id for h in index.search(ns_c, v[2], 8)] == ["c"]
    assert index.search(NS_A, v[2], 8) == []
    assert [h.donor_id for h in index.search(NS_B, v[2], 8)] == ["b"]
    assert index.vector("c") is not None and float(index.vector("c") @ v[2]) > 0.99


def test_search_hits_give_a_second_chance_at_eviction_and_are_bounded(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search does not reorder the index (a million-entry dict moved a donor per hit and stalled ~80 ms whenever it
    resized); a donor found since it was last at the front of the order is moved back once instead of evicted, and
    at most ``MAX_HITS`` such donors are remembered."""
    monkeypatch.setattr(donor_index, "MAX_HITS", 2)
    index = storage.index(4)
    v = unit_rows(8)
    for i in range(4):
        index.insert(f"d{i}", NS_A, v[i])
    for i in (0, 1, 2):
        assert index.search(NS_A, v[i], 1)[0].donor_id == f"d{i}"  # d2's hit is past the bound: not remembered
    assert index.insert("d4", NS_A, v[4]) == ["d2"]  # d0 and d1 moved back, behind d3 and d4: d3 d4 d0 d1
    assert index.insert("d5", NS_A, v[5]) == ["d3"]
    assert index.insert_batch(["d6", "d7"], NS_A, v[6:8]) == ["d4", "d0"]  # d0's second chance was spent
    assert len(index) == 4 and all(d in index for d in ("d1", "d5", "d6", "d7"))


def test_batch_larger_than_capacity_keeps_the_newest(storage: Storage) -> None:
    index = storage.index(4)
    index.insert("old", NS_A, unit_rows(1, seed=9)[0])
    evicted = index.insert_batch([f"d{i}" for i in range(6)], NS_A, unit_rows(6))
    assert sorted(evicted) == ["d0", "d1", "old"]
    assert len(index) == 4 and all(f"d{i}" in index for i in range(2, 6))
    evicted = index.insert_batch([f"d{i}" for i in range(2, 8)], NS_A, unit_rows(6, seed=3))  # d2-d5 held already
    assert sorted(evicted) == ["d2", "d3"]  # left out of the batch, and gone from the index (d4, d5 replaced)
    assert len(index) == 4 and all(f"d{i}" in index for i in range(4, 8))


def test_duplicate_id_replaces_vector_even_across_namespaces(storage: Storage) -> None:
    index = storage.index(10)
    v = unit_rows(2)
    index.insert("d", NS_A, v[0])
    assert index.insert("d", NS_A, v[1]) == []
    assert len(index) == 1
    assert index.search(NS_A, v[1], 1)[0].similarity == pytest.approx(1.0, abs=1e-3)
    index.insert("d", NS_B, v[1])
    assert index.namespace_of("d") == NS_B and index.namespaces() == [NS_B]
    assert index.search(NS_A, v[1], 8) == []


def test_delete(storage: Storage) -> None:
    index = storage.index(100)
    vectors = unit_rows(40)
    index.insert_batch([f"d{i}" for i in range(40)], NS_A, vectors)
    for i in range(0, 40, 2):
        assert index.delete(f"d{i}")
    assert not index.delete("d0") and not index.delete("never-indexed")
    assert len(index) == index.size(NS_A) == 20
    for i in range(0, 40, 2):  # a deleted donor never comes back, even for its own vector
        assert all(int(h.donor_id[1:]) % 2 == 1 for h in index.search(NS_A, vectors[i], 10))
    for i in range(1, 40, 2):
        index.delete(f"d{i}")
    assert len(index) == 0 and index.namespaces() == []


@pytest.mark.parametrize(
    ("vector", "message"),
    [
        (np.full(DIM, np.nan), "NaN or inf"),
        (np.r_[np.ones(DIM - 1), np.inf], "NaN or inf"),
        (np.zeros(DIM), "zero norm"),
        (np.ones(DIM + 1), "shape"),
        (np.ones((2, DIM)), "shape"),
    ],
)
def test_invalid_vectors_are_rejected(storage: Storage, vector: np.ndarray, message: str) -> None:
    index = storage.index(10)
    with pytest.raises(DonorIndexError, match=message):
        index.insert("d", NS_A, vector)
    with pytest.raises(DonorIndexError, match=message):
        index.search(NS_A, vector, 1)
    assert len(index) == 0


def test_invalid_ids_and_k_are_rejected() -> None:
    index = DonorIndex(DIM, capacity=10, backend=IndexBackend.NUMPY)
    v = unit_rows(2)
    with pytest.raises(DonorIndexError, match="donor_id"):
        index.insert("", NS_A, v[0])
    with pytest.raises(DonorIndexError, match="namespace"):
        index.insert("d", "", v[0])
    with pytest.raises(DonorIndexError, match="distinct"):
        index.insert_batch(["d", "d"], NS_A, v)
    with pytest.raises(ValueError, match="k must be"):
        index.search(NS_A, v[0], 0)
    assert index.insert_batch([], NS_A, np.zeros((0, DIM))) == []


def test_auto_backend_follows_capacity() -> None:
    assert resolve_backend(IndexBackend.AUTO, AUTO_NUMPY_MAX_CAPACITY) is IndexBackend.NUMPY
    big = resolve_backend(IndexBackend.AUTO, AUTO_NUMPY_MAX_CAPACITY + 1)
    assert big is (IndexBackend.USEARCH if usearch_available() else IndexBackend.NUMPY)
    cfg = SemblendConfig(index_capacity=1000)
    assert DonorIndex.from_config(cfg, DIM).backend is IndexBackend.NUMPY


def test_concurrent_inserts_searches_and_deletes_stay_consistent(storage: Storage) -> None:
    index = storage.index(200)
    vectors = unit_rows(400)
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        try:
            for i in range(offset, 400, 4):
                index.insert(f"d{i}", NS_A, vectors[i])
                if i % 3 == 0:
                    index.delete(f"d{i}")
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    def reader() -> None:
        try:
            for q in vectors[:200]:
                for hit in index.search(NS_A, q, 8):
                    assert isinstance(hit, DonorHit)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(o,)) for o in range(4)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(index) <= 200 and len(index) == index.size(NS_A)
    assert all(f"d{i}" not in index for i in range(0, 400, 3))


@pytest.mark.skipif(not usearch_available(), reason="usearch not installed")
@pytest.mark.parametrize("dtype", ["f16", "i8"])
def test_usearch_removals_are_batched_and_never_returned(dtype: VectorDtype) -> None:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((600, 16)).astype(np.float32)
    index = DonorIndex(16, 1000, IndexBackend.USEARCH, dtype=dtype)
    index.insert_batch([f"d{i}" for i in range(600)], "ns", vectors)
    part = index._partitions["ns"]
    batch = part.REMOVE_BATCH  # type: ignore[attr-defined]
    removed = {f"d{i}" for i in range(batch - 1)}
    for donor_id in removed:
        assert index.delete(donor_id)
    assert len(part._pending) == batch - 1  # type: ignore[attr-defined]
    assert index.size("ns") == 600 - (batch - 1)
    for i in range(batch - 1):  # each removed donor's own vector: its nearest neighbour was itself
        hits = index.search("ns", vectors[i], 8)
        assert len(hits) == 8 and not {h.donor_id for h in hits} & removed
    assert index.delete(f"d{batch - 1}")  # the batch is full: handed to usearch at once
    assert not part._pending  # type: ignore[attr-defined]
    assert index.size("ns") == 600 - batch
    assert not {h.donor_id for h in index.search("ns", vectors[0], 8)} & (removed | {f"d{batch - 1}"})


def test_read_back_is_a_unit_float32_vector_close_to_the_inserted_one(storage: Storage) -> None:
    index = storage.index(100, dim=384)
    vectors = unit_rows(20, seed=3, dim=384)
    index.insert_batch([f"d{i}" for i in range(20)], NS_A, vectors * 5.0)
    for i in (0, 7, 19):
        back = index.vector(f"d{i}")
        assert back is not None and back.dtype == np.float32 and back.shape == (384,)
        assert float(np.linalg.norm(back)) == pytest.approx(1.0, abs=1e-3)
        assert float(back @ vectors[i]) > 0.9999
    assert index.vector("never-indexed") is None


@pytest.mark.skipif(not usearch_available(), reason="usearch not installed")
def test_i8_read_back_sent_to_a_peer_is_indexed_as_the_same_codes() -> None:
    """A sync page carries the read-back as float16 (DonorRegistration.pack_embedding); a peer indexing it with i8
    stores the codes this replica holds, so the approximation does not compound from replica to replica."""
    vectors = unit_rows(300, seed=4, dim=384)
    ids = [f"d{i}" for i in range(300)]
    here = DonorIndex(384, 1000, IndexBackend.USEARCH, dtype="i8")
    here.insert_batch(ids, NS_A, vectors)
    sent = [DonorRegistration.pack_embedding(here.vector(d))[0] for d in ids]  # type: ignore[arg-type]
    received = np.stack([np.frombuffer(b, dtype="<f2").astype(np.float32) for b in sent])
    peer = DonorIndex(384, 1000, IndexBackend.USEARCH, dtype="i8")
    peer.insert_batch(ids, NS_A, received)
    for d in ids:
        assert np.array_equal(peer.vector(d), here.vector(d))  # type: ignore[arg-type]
    # usearch's multi-threaded batch add leaves a few nodes of a small new graph unreachable (here ~0.7% of 300 in
    # one batch, against none single-threaded; 0.1 against 0.05% at 20K in batches of 2,048), so most, not every,
    # donor must be its own nearest hit.
    for index in (peer, here):
        found = sum(index.search(NS_A, vectors[i], 1)[0].donor_id == ids[i] for i in range(300))
        assert found >= 285


def test_quantize_i8_uses_the_full_range_per_vector_and_is_stable() -> None:
    rows = unit_rows(50, seed=6, dim=384)
    codes = quantize_i8(rows)
    assert codes.dtype == np.int8 and (np.abs(codes).max(axis=1) == 127).all()
    rescaled = codes.astype(np.float32) * np.float32(0.003)
    assert np.array_equal(quantize_i8(rescaled), codes)
    dequantized = codes.astype(np.float32) / np.linalg.norm(codes.astype(np.float32), axis=1, keepdims=True)
    assert (np.sum(dequantized * rows, axis=1) > 0.9999).all()


def test_index_dtype_setting_reaches_the_index_and_bad_values_are_refused() -> None:
    assert DonorIndex.from_config(SemblendConfig(index_capacity=10), DIM).dtype == "i8"
    cfg = SemblendConfig.load(env={"SEMBLEND_INDEX_DTYPE": "f16", "SEMBLEND_INDEX_CAPACITY": "10"})
    assert DonorIndex.from_config(cfg, DIM).dtype == "f16"
    with pytest.raises(ConfigError) as err:
        SemblendConfig.load(env={"SEMBLEND_INDEX_DTYPE": "int4"})
    message = str(err.value)
    assert "\n" not in message and "SEMBLEND_INDEX_DTYPE='int4'" in message and "'f16' or 'i8'" in message
    with pytest.raises(ValueError, match="index dtype must be 'f16' or 'i8', got 'f32'"):
        DonorIndex(DIM, 10, IndexBackend.NUMPY, dtype="f32")  # type: ignore[arg-type]
