"""The donor index: top-k cosine search over resident donors' embeddings, partitioned by namespace.

Every namespace digest (:meth:`~semblend_dynamo.namespace.NamespaceKey.digest`) gets its own sub-index, so a
search can never return a donor from another model, tokenizer, LoRA, cache salt or tenant (docs/architecture.md). The
whole index holds at most ``capacity`` donors; inserting beyond that evicts the least recently used donor and reports its
id, so the caller can emit a lifecycle event. "Least recently used" is approximated as CLOCK does it: the oldest
inserted goes first, unless a search returned it since it was last at the front, in which case it goes back once.

Backends (chosen from docs/benchmarks.md "Donor search"): exact numpy brute force for small indexes; usearch HNSW
with int8 (or f16) storage and native deletions for large ones. ``IndexBackend.AUTO`` picks by ``capacity``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, cast

import numpy as np
from pydantic import BaseModel, ConfigDict

from . import index_snapshot
from .config import IndexBackend
from .index_snapshot import SnapshotError
from .vector_codes import quantize_i8, unit_rows

log = logging.getLogger(__name__)

# AUTO uses exact numpy search up to this capacity and usearch HNSW beyond (measured: docs/benchmarks.md).
AUTO_NUMPY_MAX_CAPACITY = 20_000

NAMESPACE_BITS = 24
"""A key's low bits name its namespace's slot, so no map from key to namespace is kept (~50 B a donor)."""
MAX_HITS = 65_536
"""Donors found by a search that the index remembers for their second chance at eviction, at most (a bounded set
resizes in well under a millisecond; beyond it a hit is not remembered)."""
_SLOT_MASK = (1 << NAMESPACE_BITS) - 1
MAX_NAMESPACES = 1 << NAMESPACE_BITS
"""Namespaces with donors at once at most (a slot is reused once its namespace has none left)."""

VectorDtype = Literal["f16", "i8"]
"""How the usearch backend stores vectors (``SEMBLEND_INDEX_DTYPE``); the numpy backend always keeps float32."""


class DonorIndexError(ValueError):
    """Invalid input to the index (bad vector, empty id). Discovery declines such a prompt ``INVALID_EMBEDDING``."""


class DonorHit(BaseModel):
    """One search result; ``similarity`` is the cosine between query and donor embedding."""

    model_config = ConfigDict(frozen=True)

    donor_id: str
    similarity: float


class _Partition(Protocol):
    """The vectors of one namespace, addressed by integer keys unique within the whole index."""

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None: ...

    def remove(self, key: int) -> None: ...

    def vector(self, key: int) -> np.ndarray:
        """The stored vector of a key as float32."""
        ...

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, similarities), best first, at most k."""
        ...

    def __len__(self) -> int: ...


class _NumpyPartition:
    """Exact inner-product search over a dense array; deletion swaps the last row into the hole."""

    def __init__(self, dim: int) -> None:
        self._vectors = np.empty((16, dim), dtype=np.float32)
        self._keys = np.empty(16, dtype=np.int64)
        self._slot: dict[int, int] = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        need = self._n + len(keys)
        if need > len(self._keys):
            size = max(need, 2 * len(self._keys))
            self._vectors = np.resize(self._vectors, (size, self._vectors.shape[1]))
            self._keys = np.resize(self._keys, size)
        self._vectors[self._n : need] = vectors
        self._keys[self._n : need] = keys
        for i, key in enumerate(keys.tolist()):
            self._slot[key] = self._n + i
        self._n = need

    def remove(self, key: int) -> None:
        slot = self._slot.pop(key)
        last = self._n - 1
        if slot != last:
            self._vectors[slot] = self._vectors[last]
            moved = int(self._keys[last])
            self._keys[slot] = moved
            self._slot[moved] = slot
        self._n = last

    def vector(self, key: int) -> np.ndarray:
        return self._vectors[self._slot[key]].copy()

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        sims = self._vectors[: self._n] @ query
        k = min(k, self._n)
        top = np.argpartition(-sims, k - 1)[:k] if k < self._n else np.arange(self._n)
        top = top[np.argsort(-sims[top], kind="stable")]
        return self._keys[top], sims[top]


class _UsearchPartition:
    """usearch HNSW with f16 or i8 storage; deletions are batched.

    i8: each unit vector is scaled so its largest component is +-127 and rounded (:func:`quantize_i8`), and usearch's
    ``cos`` metric compares the codes. usearch's own float-to-i8 cast multiplies by 127 and truncates, which leaves a
    384-d unit vector's components (~0.05) a handful of levels; and its i8 ``ip`` returns raw integer dot products.
    A search returns the cosine of the codes (within ~3e-3 of the float cosine at 384 dims), and :meth:`vector` the codes
    rescaled to unit length, which quantizes back to the same codes (a peer indexing it stores what this one does).

    The first search after ``Index.remove`` pays a pass over the whole index (measured ~5 ms at 100K and ~50 ms at
    1M vectors, whichever key was removed): that was the donor-search p99 tail. So removed keys wait in
    ``_pending`` (filtered out of results) and go to usearch in one batch of :data:`REMOVE_BATCH` keys, followed by
    one throwaway search that absorbs the pass on the mutation path, not on a routing request.
    """

    REMOVE_BATCH = 256

    def __init__(
        self, dim: int, connectivity: int, expansion_add: int, expansion_search: int, dtype: VectorDtype
    ) -> None:
        from usearch.index import Index

        self._i8 = dtype == "i8"
        self._index = Index(
            ndim=dim,
            metric="cos" if self._i8 else "ip",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        self._pending: set[int] = set()
        probe = np.zeros((1, dim), dtype=np.float32)
        probe[0, 0] = 1.0
        self._probe = self._stored(probe)[0]

    def _stored(self, rows: np.ndarray) -> np.ndarray:
        """Unit float32 rows as this index takes them."""
        return quantize_i8(rows) if self._i8 else rows

    def __len__(self) -> int:
        return len(self._index) - len(self._pending)

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        self._index.add(keys.astype(np.uint64), self._stored(vectors), threads=0 if len(keys) > 1 else 1)

    def remove(self, key: int) -> None:
        self._pending.add(key)
        if len(self._pending) >= self.REMOVE_BATCH:
            self.flush_removals()

    def vector(self, key: int) -> np.ndarray:
        stored = np.asarray(self._index.get(key), dtype=np.float32).reshape(-1)
        return stored / np.float32(np.linalg.norm(stored)) if self._i8 else stored

    def save(self, path: str) -> None:
        self.flush_removals()
        self._index.save(path)

    def load(self, blob: memoryview, keys: np.ndarray) -> None:
        """Take a saved index (:meth:`save`) holding exactly ``keys``; raises SnapshotError otherwise."""
        meta = self._index.metadata(blob)
        if not meta or meta["dimensions"] != self._index.ndim or meta["count_present"] != len(keys):
            raise SnapshotError("bad_snapshot", f"usearch blob {meta} does not hold {len(keys)} donors")
        if meta["kind_scalar"] != self._index.dtype or meta["kind_metric"] != self._index.metric:
            raise SnapshotError("incompatible", f"usearch blob of {meta['kind_scalar']} / {meta['kind_metric']}")
        self._index.load(blob)
        if not np.all(self._index.contains(keys.astype(np.uint64))):
            raise SnapshotError("bad_snapshot", "usearch blob lacks keys its section lists")

    def stored(self, keys: np.ndarray) -> list[bytes]:
        """The stored rows of ``keys`` (present ones) as bytes: int8 codes, or float16."""
        # the compiled lookup's rows as they are: Index.get views each one in a numpy dtype first, a Python call a
        # key (~40% of a sync page's read-back)
        get_many = getattr(getattr(self._index, "_compiled", None), "get_many", None)
        if get_many is None:
            return [row.tobytes() for row in self._index.get(keys.astype(np.uint64))]  # type: ignore[union-attr]
        return list(map(bytes, get_many(keys.astype(np.uint64), self._index.dtype)))

    def flush_removals(self) -> None:
        """Hand the pending removals to usearch at once and pay its post-removal pass here."""
        if not self._pending:
            return
        self._index.remove(np.fromiter(self._pending, dtype=np.uint64, count=len(self._pending)))
        self._pending.clear()
        if len(self._index):
            self._index.search(self._probe, 1, threads=1)

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        # Over-fetch by at most k (a beam of k + 256 costs ~5x); when pending keys crowd the answer, fetch them all.
        keys, sims = self._live(query, k + min(k, len(self._pending)))
        if len(keys) < k and self._pending:
            keys, sims = self._live(query, k + len(self._pending))
        return keys[:k], sims[:k]

    def _live(self, query: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        matches = self._index.search(self._stored(query.reshape(1, -1))[0], count, threads=1)
        keys = np.asarray(matches.keys, dtype=np.int64)
        sims = 1.0 - np.asarray(matches.distances, dtype=np.float32)
        if self._pending:
            live = np.fromiter((key not in self._pending for key in keys.tolist()), dtype=bool, count=len(keys))
            keys, sims = keys[live], sims[live]
        return keys, sims


def usearch_available() -> bool:
    """True when usearch can be imported.

    onnxruntime is imported first when it is installed: importing usearch's native module before onnxruntime's
    crashes the process (SIGSEGV) with usearch 2.26 + onnxruntime 1.31 wheels, whatever the caller does later.
    """
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401
    try:
        import usearch.index  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: IndexBackend, capacity: int) -> IndexBackend:
    """The concrete backend for ``backend`` (AUTO: numpy up to AUTO_NUMPY_MAX_CAPACITY, usearch beyond)."""
    if backend is IndexBackend.NUMPY:
        return backend
    if backend is IndexBackend.USEARCH:
        if not usearch_available():
            raise DonorIndexError("SEMBLEND_INDEX_BACKEND=usearch needs usearch: pip install 'semblend-dynamo[ann]'")
        return backend
    if capacity <= AUTO_NUMPY_MAX_CAPACITY:
        return IndexBackend.NUMPY
    if usearch_available():
        return IndexBackend.USEARCH
    log.warning(
        "index capacity %d would use usearch HNSW but usearch is not installed; using exact numpy search "
        "(slower at this size). Install it with: pip install 'semblend-dynamo[ann]'",
        capacity,
    )
    return IndexBackend.NUMPY


class DonorIndex:
    """Namespace-partitioned, capacity-bounded (CLOCK, an approximate LRU) donor embedding index. All methods are
    thread-safe."""

    def __init__(
        self,
        dim: int,
        capacity: int,
        backend: IndexBackend = IndexBackend.AUTO,
        *,
        expansion_add: int = 128,
        expansion_search: int = 64,
        connectivity: int = 16,
        dtype: VectorDtype = "i8",
    ) -> None:
        """``expansion_add``/``expansion_search``/``connectivity`` are the HNSW efConstruction/ef/M of the usearch
        backend, ``dtype`` its vector storage."""
        if dim < 1 or capacity < 1:
            raise ValueError(f"dim and capacity must be >= 1, got dim={dim} capacity={capacity}")
        if dtype not in ("f16", "i8"):
            raise ValueError(f"index dtype must be 'f16' or 'i8', got {dtype!r}")
        self.dim = dim
        self.capacity = capacity
        self.backend = resolve_backend(backend, capacity)
        self.dtype: VectorDtype = dtype
        self._expansion_add = expansion_add
        self._expansion_search = expansion_search
        self._connectivity = connectivity
        self._lock = threading.Lock()
        # Held (outside _lock) by every change, and by a snapshot being saved: searches, which take _lock only, go on
        # while the graphs are written out.
        self._changing = threading.Lock()
        self._partitions: dict[str, _Partition] = {}
        # Flat maps of strings and ints only: per-donor tuples would be objects the garbage collector must walk, and at
        # 1M donors a full collection over them stalled searches for ~40 ms (docs/benchmarks.md, donor search). A plain
        # dict, not an OrderedDict (whose links cost ~45 B a donor), and a search does not move what it finds in it:
        # moving means popping and setting again, and every so many moves the dict resizes (~80 ms at 1M donors).
        self._lru: dict[str, int] = {}  # donor id -> key, in insertion order (with second chances: _hits)
        self._hits: set[str] = set()  # found by a search since last at the front of _lru (at most MAX_HITS)
        self._ids: dict[int, str] = {}  # key -> donor id
        self._namespace_slots: dict[str, int] = {}  # namespace -> the low bits of its keys
        self._slot_namespaces: list[str | None] = []
        self._free_slots: list[int] = []
        self._next_serial = 0

    @property
    def stores_codes(self) -> bool:
        """Whether the index keeps int8 codes (usearch, i8): then a vector's codes are all it needs of it."""
        return self.backend is IndexBackend.USEARCH and self.dtype == "i8"

    @classmethod
    def from_config(cls, cfg: Any, dim: int) -> DonorIndex:
        """From a :class:`~semblend_dynamo.config.SemblendConfig` and the embedder's dimension."""
        return cls(dim, cfg.index_capacity, cfg.index_backend, dtype=cfg.index_dtype)

    # --- input checks ----------------------------------------------------------------------------
    def _unit(self, vector: Any) -> np.ndarray:
        """One query/donor vector, validated and L2-normalised."""
        arr = np.asarray(vector, dtype=np.float32)
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.shape != (self.dim,):
            raise DonorIndexError(f"vector has shape {arr.shape}, expected ({self.dim},)")
        return self._unit_rows(arr.reshape(1, -1))[0]

    def _unit_rows(self, rows: np.ndarray) -> np.ndarray:
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise DonorIndexError(f"vectors have shape {rows.shape}, expected (n, {self.dim})")
        if not np.isfinite(rows).all():
            raise DonorIndexError("vector contains NaN or inf")
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        if (norms <= 1e-12).any():
            raise DonorIndexError("vector has zero norm")
        return unit_rows(rows)

    @staticmethod
    def _check_name(kind: str, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise DonorIndexError(f"{kind} must be a non-empty string, got {value!r}")

    # --- mutation --------------------------------------------------------------------------------
    def insert(self, donor_id: str, namespace: str, vector: Any) -> list[str]:
        """Add or replace ``donor_id`` (a known id moves to ``namespace`` with the new vector).

        Returns the ids evicted to stay within capacity (never ``donor_id`` itself).
        """
        return self.insert_batch([donor_id], namespace, np.asarray(vector, dtype=np.float32).reshape(1, -1))

    def insert_batch(self, donor_ids: Sequence[str], namespace: str, vectors: Any) -> list[str]:
        """:meth:`insert` for many donors of one namespace at once (bulk registration; HNSW adds in parallel)."""
        self._check_name("namespace", namespace)
        ids = list(donor_ids)
        for donor_id in ids:
            self._check_name("donor_id", donor_id)
        if len(set(ids)) != len(ids):
            raise DonorIndexError("donor_ids in one batch must be distinct")
        rows = np.asarray(vectors, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[0] != len(ids):
            raise DonorIndexError(f"vectors have shape {rows.shape}, expected ({len(ids)}, {self.dim})")
        if not ids:
            return []
        unit = self._unit_rows(rows)
        dropped: list[str] = []
        if len(ids) > self.capacity:  # only the last `capacity` can stay; the rest count as evicted at once
            dropped, ids, unit = ids[: -self.capacity], ids[-self.capacity :], unit[-self.capacity :]
        with self._changing, self._lock:
            if (
                namespace not in self._partitions
                and not self._free_slots
                and len(self._slot_namespaces) >= MAX_NAMESPACES
            ):
                raise DonorIndexError(f"more than {MAX_NAMESPACES} namespaces with donors at once")
            for donor_id in ids:
                self._remove_locked(donor_id)
            part = self._partitions.get(namespace)
            if part is None:
                part = self._partitions[namespace] = self._new_partition()
                self._take_slot(namespace)
            serials = np.arange(self._next_serial, self._next_serial + len(ids), dtype=np.int64)
            self._next_serial += len(ids)
            keys = (serials << NAMESPACE_BITS) | self._namespace_slots[namespace]
            part.add(keys, unit)
            for donor_id, key in zip(ids, keys.tolist(), strict=True):
                self._lru[donor_id] = key
                self._ids[key] = donor_id
            evicted = dropped + self._evict_locked(len(self._lru) - self.capacity)
        return list(dict.fromkeys(evicted))

    def _evict_locked(self, excess: int) -> list[str]:
        """The ``excess`` least recently used donors removed (CLOCK: from the oldest inserted, one found by a search
        since it was last here goes back to the end once instead); their ids."""
        evicted: list[str] = []
        while excess > 0:
            # one pass over a slice of the front (a dict's first entries may be holes to skip)
            for donor_id in list(itertools.islice(self._lru, excess + len(self._hits))):
                if excess == 0:
                    break
                if donor_id in self._hits:
                    self._hits.discard(donor_id)
                    self._lru[donor_id] = self._lru.pop(donor_id)
                    continue
                self._remove_locked(donor_id)
                evicted.append(donor_id)
                excess -= 1
        return evicted

    def _take_slot(self, namespace: str) -> None:
        """Give a new namespace the low bits of its keys (the caller checked there is room)."""
        if self._free_slots:
            slot = self._free_slots.pop()
            self._slot_namespaces[slot] = namespace
        else:
            slot = len(self._slot_namespaces)
            self._slot_namespaces.append(namespace)
        self._namespace_slots[namespace] = slot

    def _namespace(self, key: int) -> str:
        namespace = self._slot_namespaces[key & _SLOT_MASK]
        assert namespace is not None
        return namespace

    def delete(self, donor_id: str) -> bool:
        """Remove a donor (evicted from KV, lease expired, ...); False if it was not indexed."""
        with self._changing, self._lock:
            return self._remove_locked(donor_id)

    def _remove_locked(self, donor_id: str) -> bool:
        key = self._lru.pop(donor_id, None)
        if key is None:
            return False
        self._hits.discard(donor_id)
        del self._ids[key]
        namespace = self._namespace(key)
        part = self._partitions[namespace]
        part.remove(key)
        if len(part) == 0:
            del self._partitions[namespace]
            slot = self._namespace_slots.pop(namespace)
            self._slot_namespaces[slot] = None
            self._free_slots.append(slot)
        return True

    def _new_partition(self) -> _Partition:
        if self.backend is IndexBackend.USEARCH:
            return _UsearchPartition(
                self.dim, self._connectivity, self._expansion_add, self._expansion_search, self.dtype
            )
        return _NumpyPartition(self.dim)

    # --- queries ---------------------------------------------------------------------------------
    def search(self, namespace: str, vector: Any, k: int) -> list[DonorHit]:
        """Top-``k`` donors of ``namespace`` by cosine, best first; [] for an unknown namespace.

        Called on the routing path. A hit gives its donor a second chance at eviction.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        query = self._unit(vector)
        with self._lock:
            part = self._partitions.get(namespace)
            if part is None:
                return []
            keys, sims = part.search(query, k)
            hits = []
            for key, sim in zip(keys.tolist(), sims.tolist(), strict=True):
                donor_id = self._ids.get(key)
                if donor_id is None:  # defensive: an ANN backend returning a removed key
                    continue
                if len(self._hits) < MAX_HITS:
                    self._hits.add(donor_id)
                hits.append(DonorHit(donor_id=donor_id, similarity=min(1.0, max(-1.0, sim))))
        return hits

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)

    def __contains__(self, donor_id: object) -> bool:
        with self._lock:
            return donor_id in self._lru

    def size(self, namespace: str) -> int:
        """Donors indexed in ``namespace`` (0 if unknown)."""
        with self._lock:
            part = self._partitions.get(namespace)
            return len(part) if part is not None else 0

    def namespaces(self) -> list[str]:
        """Namespaces with at least one donor, sorted."""
        with self._lock:
            return sorted(self._partitions)

    def vector(self, donor_id: str) -> np.ndarray | None:
        """The unit vector indexed for ``donor_id`` as float32, or None.

        Exact with numpy; with usearch, what the index stores: float16 precision (f16), or the int8 codes rescaled to
        unit length (i8: cosine to the inserted vector above 0.9999, and re-inserting it stores the same codes).
        """
        with self._lock:
            key = self._lru.get(donor_id)
            return None if key is None else self._partitions[self._namespace(key)].vector(key)

    def stored_embeddings(self, donor_ids: Sequence[str], namespace: str | None = None) -> list[bytes | None]:
        """Each donor's embedding as a peer's catalog keeps it, read back in one call (None: not indexed, or not in
        ``namespace`` if given): int8 codes (i8, as stored), else float16 bytes (as stored with f16; of the exact vector
        with numpy)."""
        with self._lock:
            keys = np.array(list(map(self._lru.get, donor_ids)), dtype=object)
            out: list[bytes | None] = [None] * len(keys)
            at = np.flatnonzero(keys != None)  # noqa: E711  # elementwise: the donors indexed
            held = keys[at].astype(np.int64)
            slots = held & _SLOT_MASK
            wanted = None if namespace is None else self._namespace_slots.get(namespace)
            for slot in np.unique(slots).tolist():
                if namespace is not None and slot != wanted:
                    continue
                part = self._partitions[cast(str, self._slot_namespaces[slot])]
                mine = slots == slot
                picked = held[mine]
                if isinstance(part, _UsearchPartition):
                    stored = part.stored(picked)
                else:  # exact float32: as float16, as a catalog keeps it
                    stored = [part.vector(key).astype("<f2").tobytes() for key in picked.tolist()]
                if len(at) == len(out) and len(picked) == len(out):  # the usual page: all indexed, one namespace
                    return list[bytes | None](stored)
                for i, row in zip(at[mine].tolist(), stored, strict=True):
                    out[i] = row
        return out

    def namespace_of(self, donor_id: str) -> str | None:
        """The namespace a donor is indexed under, or None."""
        with self._lock:
            key = self._lru.get(donor_id)
            return self._namespace(key) if key is not None else None

    # --- snapshots: a peer's whole index loaded instead of inserted donor by donor --------------------------
    @property
    def saves_snapshots(self) -> bool:
        """Whether :meth:`save_snapshot` and :meth:`load_snapshot` work here (the usearch backend)."""
        return self.backend is IndexBackend.USEARCH

    def _settings(self) -> dict[str, Any]:
        return {"dim": self.dim, "dtype": self.dtype, "connectivity": self._connectivity}

    def save_snapshot(self, path: str | os.PathLike[str]) -> int:
        """Write every donor to ``path`` (:mod:`semblend_dynamo.index_snapshot`); the donors written.

        Searches go on meanwhile (the graphs are only read); changes wait until it is written.
        """
        if not self.saves_snapshots:
            raise DonorIndexError("only a usearch index saves snapshots")
        with self._changing:
            with self._lock:
                for part in self._partitions.values():
                    assert isinstance(part, _UsearchPartition)
                    part.flush_removals()
                lru = self._lru.copy()  # one C-level copy: the grouping below runs outside _lock
                slots = dict(self._namespace_slots)
                partitions = dict(self._partitions)
            ids = list(lru)
            keys = np.fromiter(lru.values(), dtype=np.int64, count=len(ids))
            key_slots = keys & _SLOT_MASK
            order = np.argsort(key_slots, kind="stable")
            bounds = np.searchsorted(key_slots[order], sorted(slots.values()), side="right")
            with open(path, "wb") as out, tempfile.TemporaryDirectory(dir=os.path.dirname(path) or None) as scratch:
                writer = index_snapshot.Writer(out)
                start = 0
                for (namespace, slot), stop in zip(sorted(slots.items(), key=lambda kv: kv[1]), bounds, strict=True):
                    rows = order[start:stop]
                    start = stop
                    part = partitions[namespace]
                    assert isinstance(part, _UsearchPartition)
                    graph = os.path.join(scratch, "graph")
                    part.save(graph)
                    writer.section(namespace, slot, keys[rows], [ids[i] for i in rows.tolist()], graph)
                    os.unlink(graph)
                writer.finish(self._settings())
        return len(ids)

    def load_snapshot(self, path: str | os.PathLike[str], same: Mapping[str, str] | None = None) -> list[str]:
        """Take a snapshot saved by a peer's :meth:`save_snapshot` into this empty index; the donors' ids.

        ``same`` maps donor ids to equal strings held already (a catalog's), kept instead of the file's: each id is
        then held once (~70 B a donor). Raises :class:`SnapshotError` (this index unchanged) when the file is not one
        this index can take, holds more than ``capacity`` donors, or the index is not empty.
        """
        if not self.saves_snapshots:
            raise SnapshotError("incompatible", "only a usearch index loads snapshots")
        with self._changing:
            if len(self):
                raise SnapshotError("not_empty", f"the index holds {len(self)} donors")
            with index_snapshot.read(path, self._settings(), NAMESPACE_BITS) as sections:
                total = sum(len(s.ids) for s in sections)
                if total > self.capacity:
                    raise SnapshotError("over_capacity", f"{total} donors for a capacity of {self.capacity}")
                partitions: dict[str, _Partition] = {}
                for section in sections:
                    part = self._new_partition()
                    assert isinstance(part, _UsearchPartition)
                    part.load(section.index, section.keys)
                    partitions[section.namespace] = part
            ids = [donor_id for s in sections for donor_id in s.ids]
            if same:
                ids = [same.get(donor_id, donor_id) for donor_id in ids]
            keys = [key for s in sections for key in s.keys.tolist()]
            slot_namespaces: list[str | None] = [None] * (max(s.slot for s in sections) + 1 if sections else 0)
            for section in sections:
                slot_namespaces[section.slot] = section.namespace
            lru = dict(zip(ids, keys, strict=True))
            by_key = dict(zip(keys, ids, strict=True))
            with self._lock:
                self._partitions = partitions
                self._namespace_slots = {s.namespace: s.slot for s in sections}
                self._slot_namespaces = slot_namespaces
                self._free_slots = [slot for slot, name in enumerate(slot_namespaces) if name is None]
                self._next_serial = (max(keys) >> NAMESPACE_BITS) + 1 if keys else 0
                self._lru, self._ids = lru, by_key
                self._hits.clear()
        return ids

    def holds(self, donor_ids: Sequence[str], namespace: str, embeddings: Sequence[bytes | None]) -> list[bool]:
        """Which donors are indexed in ``namespace`` with ``embeddings``, each as a catalog keeps it (int8 codes where
        this index stores codes: equal; else float16: its unit vector within a float16 step); those a loaded snapshot
        need not insert again."""
        stored = self.stored_embeddings(donor_ids, namespace)
        if self.stores_codes:
            return [s is not None and s == e for s, e in zip(stored, embeddings, strict=True)]
        return [
            s is not None and e is not None and len(s) == len(e) and _same_f16(s, e)
            for s, e in zip(stored, embeddings, strict=True)
        ]


def _same_f16(stored: bytes, kept: bytes) -> bool:
    """A float16 index row against a kept float16 embedding: equal within a float16 step once the latter is unit."""
    kept_row = np.frombuffer(kept, dtype="<f2").astype(np.float32)
    norm = float(np.linalg.norm(kept_row))
    if not np.isfinite(norm) or norm <= 1e-12:
        return False
    return bool(np.abs(np.frombuffer(stored, dtype="<f2").astype(np.float32) - kept_row / norm).max() <= 1e-3)
