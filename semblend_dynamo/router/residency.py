"""Which donors are resident where, followed through Dynamo's exact ``kv-events``.

A donor is a finished prompt on the worker that served it, known by its Dynamo block content hashes
(``tokens_hash``, seeded with LoRA and cache salt exactly as ``compute_block_hash_for_seq`` does). It is
*resident* only while every one of those hashes is stored on that worker's device tier (per
``(worker_id, dp_rank)``) and the worker is live. ``removed``/``cleared`` events and worker departure take
donors out; re-stored blocks bring them back. Every replica fed the same events and registrations holds
the same catalog and the same resident sets.

Not thread-safe: its owner (:class:`~semblend_dynamo.router.catalog.DonorCatalog`) holds a lock around it, except
for :meth:`Residency.read_stored_together`, which reads without it.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import attrgetter, getitem, is_, itemgetter
from typing import TypeVar, cast

import numpy as np

from .. import native_entries
from ..events.schemas import (
    SYNC_ROW_FIXED_BYTES,
    DonorRegistration,
    KvCleared,
    KvEvent,
    KvRemoved,
    KvStored,
    RowPicker,
    SyncColumns,
    SyncRows,
    dictionary_index,
    sync_page_bytes,
)
from ..vector_codes import as_vector, stored_forms, to_f16
from .u64map import NATIVE_GATE, U64Map

WorkerKey = tuple[int, int]
"""``(worker_id, dp_rank)``, Dynamo's ``WorkerWithDpRank``."""

DEVICE_TIER = "device"

_POST_BITS = 32
_POST_MASK = (1 << _POST_BITS) - 1
SHARED = _POST_MASK
"""A posting when several donors of the worker use the hash (their slots are in ``_WorkerBlocks.shared``)."""
MAX_SLOTS = SHARED - 1
"""Donor slots a residency can hand out (a posting is a slot plus one, and 0 means none)."""

_ARRAY_STORE = 64
"""A stored event of this many blocks or more is applied with array operations where it can be
(:meth:`Residency._store_new`)."""

_SMALL: dict[int, int] = {}
_T = TypeVar("_T")

_U32 = struct.Struct("<I")
_HEAD_REST = struct.Struct("<dIHB")  # registered_at, hashes_end, embedding_dim, embedding_codes
NO_SLOT = _POST_MASK
"""An entry's slot before a residency takes it."""
BLOB_HEAD = _U32.size + _HEAD_REST.size
"""A :class:`DonorEntry` blob's head: its slot (u32), ``registered_at`` (f64), ``hashes_end`` (u32),
``embedding_dim`` (u16) and ``embedding_codes`` (u8: 1 when the embedding is int8 codes, 0 for float16), kept there
rather than in slots of the entry (and the slot and the stamp as an int and a float object of their own): ~80 B a donor
less, and 19 bytes more in the blob."""
_HEAD = np.dtype(
    [("slot", "<u4"), ("registered_at", "<f8"), ("hashes_end", "<u4"), ("embedding_dim", "<u2"), ("codes", "u1")]
)  # packed: BLOB_HEAD bytes an item
_HEAD_SLICE = slice(0, BLOB_HEAD)


def blob_head(
    registered_at: float, hashes_end: int, embedding_dim: int, codes: bool = False, slot: int = NO_SLOT
) -> bytes:
    """The head of a :class:`DonorEntry` blob (``hashes_end``: the bytes of its block hashes; ``codes``: the
    embedding is int8 codes)."""
    return _U32.pack(slot) + _HEAD_REST.pack(registered_at, hashes_end, embedding_dim, codes)


def _shared_int(value: int) -> int:
    """One int object per distinct small value (token counts, dimensions: 32 bytes a donor each otherwise)."""
    held = _SMALL.get(value)
    if held is None:
        held = _SMALL.setdefault(value, value) if len(_SMALL) < 4096 else value
    return held


def _shared(values: list[_T], share: Callable[[_T], _T]) -> Iterable[_T]:
    """``values`` with each one replaced by ``share(value)``, called once per distinct value (an iterator)."""
    distinct = set(values)
    if len(distinct) == 1:  # a page's router id, token count and block size are usually everyone's
        return repeat(share(distinct.pop()), len(values))
    shared = {value: share(value) for value in distinct}
    return map(shared.__getitem__, values)


class _WorkerBlocks:
    """One worker rank's device blocks and the donors using them, in compact maps (:class:`U64Map`).

    ``hashes`` holds, per ``tokens_hash``, both how many engine blocks store it (the high 32 bits) and its
    *posting*, the donors of this worker using it (the low 32 bits: 0 none, ``slot + 1`` one donor, or
    :data:`SHARED`), so a donor's hashes are looked up once for both; a hash no block stores and no donor uses is
    not in the map.
    """

    __slots__ = ("by_block", "hashes", "key", "last_event_id", "shared")

    def __init__(self, key: WorkerKey) -> None:
        self.key = key
        self.by_block = U64Map()  # engine block id -> tokens_hash
        self.hashes = U64Map()  # tokens_hash -> engine blocks holding it << _POST_BITS | posting
        self.shared: dict[int, set[int]] = {}  # tokens_hash -> slots, for hashes several donors use
        self.last_event_id = 0

    def slots(self, tokens_hash: int, posting: int) -> Collection[int]:
        """The donor slots of ``tokens_hash``'s ``posting`` (the low bits of its value in ``hashes``)."""
        if not posting:
            return ()
        return self.shared[tokens_hash] if posting == SHARED else (posting - 1,)

    def unpost(self, tokens_hash: int, slot: int) -> None:
        value = self.hashes.get(tokens_hash)
        if value is None:
            return
        posting = value & _POST_MASK
        if posting == SHARED:
            slots = self.shared[tokens_hash]
            slots.discard(slot)
            if len(slots) == 1:
                self.hashes[tokens_hash] = value - SHARED + slots.pop() + 1
                del self.shared[tokens_hash]
        elif posting == slot + 1:
            if value == posting:
                self.hashes.pop(tokens_hash)
            else:
                self.hashes[tokens_hash] = value - posting


class DonorEntry:
    """One donor of the catalog, kept compact: a replica holds one per resident donor (a million in a large fleet).

    A decoded :class:`DonorRegistration` costs ~1.4 KB of pydantic bookkeeping per instance plus its own copies of
    strings every donor shares (deployment, namespace, router id). The entry keeps the fields in slots, those
    strings interned, the worker key shared with its worker's blocks, and its block hashes (native u64) and embedding
    packed in one ``bytes`` (``blob``: a head of :data:`BLOB_HEAD` bytes with the slot, ``registered_at``,
    ``hashes_end``, ``embedding_dim`` and the embedding's form; the hashes' ``hashes_end`` bytes; then the embedding;
    one object instead of an ``array``, a ``bytes``, an int and a float, and four slots fewer). The embedding is the
    int8 codes an i8 search index keeps when the catalog's index is i8 (``embedding_codes``, half the bytes; see
    :mod:`semblend_dynamo.vector_codes`), float16 otherwise. It rebuilds the registration (without
    validation: it was validated on arrival) when one is needed. Once the search index holds the vector the entry
    drops its embedding (:meth:`drop_embedding`; ``own_embedding`` is None then): a sync page reads it back from the
    index and carries it beside the entry (:func:`sync_columns`). The request path reads ``worker``, ``donor_key``
    and ``missing``, which stay slots.
    """

    __slots__ = (
        "blob",
        "block_size",
        "deployment",
        "donor_id",
        "donor_key",
        "missing",
        "namespace",
        "num_tokens",
        "router_id",
        "worker",
    )

    def __init__(
        self,
        donor_id: str,
        donor_key: str | None,
        router_id: str,
        worker: WorkerKey,
        deployment: str,
        namespace: str,
        num_tokens: int,
        block_size: int,
        blob: bytes,
    ) -> None:
        """Takes its strings interned and its small ints shared already (:meth:`of`, :meth:`Residency.add_rows`);
        ``blob``: the head (:func:`blob_head`: no slot yet), the block hashes (``hashes_end`` bytes, native u64), then
        the embedding."""
        self.donor_id = donor_id
        self.donor_key = donor_key
        self.router_id = router_id
        self.worker = worker
        self.deployment = deployment
        self.namespace = namespace
        self.num_tokens = num_tokens
        self.block_size = block_size
        self.blob = blob
        self.missing = -1  # hashes not stored on the worker, counted once the residency posts the entry

    @classmethod
    def of(
        cls, r: DonorRegistration, worker: WorkerKey, embedding: bytes | None = None, codes: bool = False
    ) -> DonorEntry:
        """The entry of a registration (``worker``: its worker key, shared with the worker's blocks) keeping its
        embedding as ``embedding`` (the registration's float16 one by default, or its int8 codes with ``codes``)."""
        hashes = array("Q", r.block_hashes).tobytes()
        return cls(
            r.donor_id,
            r.donor_key,
            sys.intern(r.router_id),
            worker,
            sys.intern(r.deployment),
            sys.intern(r.namespace),
            _shared_int(r.num_tokens),
            _shared_int(r.block_size),
            b"".join(
                (
                    blob_head(r.registered_at, len(hashes), r.embedding_dim, codes),
                    hashes,
                    r.embedding if embedding is None else embedding,
                )
            ),
        )

    @property
    def worker_id(self) -> int:
        return self.worker[0]

    @property
    def dp_rank(self) -> int:
        return self.worker[1]

    @property
    def slot(self) -> int:
        """The entry's slot in its residency (``NO_SLOT`` until one takes it); it stays the entry's until removed."""
        return _U32.unpack_from(self.blob)[0]  # type: ignore[no-any-return]

    @slot.setter
    def slot(self, slot: int) -> None:
        self.blob = _U32.pack(slot) + self.blob[_U32.size :]

    @property
    def registered_at(self) -> float:
        return _HEAD_REST.unpack_from(self.blob, _U32.size)[0]  # type: ignore[no-any-return]

    @property
    def hashes_end(self) -> int:
        """The bytes of the block hashes (after the head)."""
        return _HEAD_REST.unpack_from(self.blob, _U32.size)[1]  # type: ignore[no-any-return]

    @property
    def embedding_dim(self) -> int:
        return _HEAD_REST.unpack_from(self.blob, _U32.size)[2]  # type: ignore[no-any-return]

    @property
    def block_hashes(self) -> Sequence[int]:
        """The donor's block hashes (a read-only view of its blob)."""
        return memoryview(self.blob)[BLOB_HEAD : BLOB_HEAD + self.hashes_end].cast("Q")

    @property
    def embedding_codes(self) -> bool:
        """Whether the embedding is int8 codes (else float16); an entry's form never changes."""
        return bool(self.blob[BLOB_HEAD - 1])

    @property
    def embedded(self) -> bool:
        """Whether the entry holds its embedding (False once the search index holds it)."""
        blob = self.blob
        _, hashes_end, dim, _ = _HEAD_REST.unpack_from(blob, _U32.size)
        return len(blob) > BLOB_HEAD + hashes_end or not dim

    @property
    def own_embedding(self) -> bytes | None:
        """The embedding as kept (int8 codes if ``embedding_codes``, else float16), or None once the search index
        holds it."""
        blob = self.blob  # read once: drop_embedding replaces the blob with one that ends after the hashes
        _, hashes_end, dim, _ = _HEAD_REST.unpack_from(blob, _U32.size)
        end = BLOB_HEAD + hashes_end
        return blob[end:] if len(blob) > end or not dim else None

    @property
    def embedding(self) -> bytes:
        """The embedding as kept; only for an entry that holds it (see the class docstring)."""
        embedding = self.own_embedding
        if embedding is None:
            raise LookupError(f"donor {self.donor_id}: its embedding is held by the search index")
        return embedding

    def drop_embedding(self) -> None:
        """The search index holds the vector: keep only the head and the hashes."""
        self.blob = self.blob[: BLOB_HEAD + self.hashes_end]

    def vector(self) -> np.ndarray:
        """The embedding as float32: float16 values as :meth:`DonorRegistration.vector` gives them, int8 codes rescaled
        to unit length (an i8 index stores the same codes from it as from the float vector they came from)."""
        return as_vector(self.embedding, self.embedding_codes)

    @property
    def registration(self) -> DonorRegistration:
        fields = {name: getattr(self, name) for name in _REGISTRATION_SLOTS}
        fields.update(
            registered_at=self.registered_at,
            embedding_dim=self.embedding_dim,
            worker_id=self.worker[0],
            dp_rank=self.worker[1],
            block_hashes=list(self.block_hashes),
            embedding=to_f16(self.embedding, self.embedding_codes),
        )
        return DonorRegistration.model_construct(**fields)


_DONOR_ID = attrgetter("donor_id")
_NAMESPACE = attrgetter("namespace")
_WORKER = attrgetter("worker")
_BLOB = attrgetter("blob")
_ROUTER_ID = attrgetter("router_id")
_HEAD_OF = itemgetter(_HEAD_SLICE)
_DONOR_KEY = attrgetter("donor_key")


def _heads(entries: Iterable[DonorEntry]) -> np.ndarray:
    """The entries' blob heads as one structured array (:data:`BLOB_HEAD`)."""
    return _blob_heads(map(_BLOB, entries))


def _blob_heads(blobs: Iterable[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(map(_HEAD_OF, blobs)), dtype=_HEAD)


def sync_row_bytes(entries: Sequence[DonorEntry]) -> list[int]:
    """:func:`~semblend_dynamo.events.schemas.sync_page_bytes` of each entry (embedding held or not), for many at
    once: the bound a sync page's budget counts."""
    ids, routers, namespaces = list(map(_DONOR_ID, entries)), list(map(_ROUTER_ID, entries)), map(_NAMESPACE, entries)
    keys = [key or "" for key in map(_DONOR_KEY, entries)]
    if not ("".join(ids).isascii() and "".join(keys).isascii() and "".join(routers).isascii()):
        return [sync_page_bytes(entry) for entry in entries]
    heads = _heads(entries)
    sizes = (
        SYNC_ROW_FIXED_BYTES
        + sum(np.fromiter(map(len, column), np.int64, len(entries)) for column in (ids, keys, routers, namespaces))
        + heads["hashes_end"].astype(np.int64)
        + heads["embedding_dim"].astype(np.int64) * (2 - heads["codes"].astype(np.int64))
    )
    return sizes.tolist()  # type: ignore[no-any-return]


def embedding_dims(entries: Sequence[DonorEntry]) -> np.ndarray:
    """Each entry's ``embedding_dim``, for many at once."""
    return _heads(entries)["embedding_dim"]


def held_embeddings(entries: Sequence[DonorEntry]) -> list[bool]:
    """:attr:`DonorEntry.embedded` of each entry, for many at once."""
    heads = _heads(entries)
    lengths = np.fromiter(map(len, map(_BLOB, entries)), np.int64, len(entries))
    held = (lengths > heads["hashes_end"].astype(np.int64) + BLOB_HEAD) | (heads["embedding_dim"] == 0)
    return held.tolist()  # type: ignore[no-any-return]


def sync_columns(
    entries: Sequence[DonorEntry], blobs: Sequence[bytes], embeddings: Sequence[bytes | None]
) -> SyncColumns:
    """A sync page's columns straight from catalog entries: what :meth:`SyncColumns.of` gives for their registrations,
    with column operations on the blobs instead of a property call a field a donor. ``blobs[i]`` is entry ``i``'s blob
    as read under its catalog's lock (the indexer's thread may drop an entry's embedding since), ``embeddings[i]`` its
    embedding in the entry's form when the search index holds it (None: its blob holds it)."""
    heads = _blob_heads(blobs)
    ends = (heads["hashes_end"].astype(np.int64) + BLOB_HEAD).tolist()
    workers = np.array(list(map(_WORKER, entries)), dtype=np.uint64).reshape(-1, 2)
    routers, router_index = dictionary_index(list(map(_ROUTER_ID, entries)))
    namespaces, namespace_index = dictionary_index(list(map(_NAMESPACE, entries)))
    hashes = b"".join([blob[BLOB_HEAD:end] for blob, end in zip(blobs, ends, strict=True)])
    return SyncColumns(
        donor_ids=list(map(_DONOR_ID, entries)),
        donor_keys=list(map(_DONOR_KEY, entries)),
        router_ids=routers,
        namespaces=namespaces,
        router_index=router_index,
        namespace_index=namespace_index,
        worker_ids=workers[:, 0].astype("<u8").tobytes(),
        dp_ranks=workers[:, 1].astype("<u4").tobytes(),
        num_tokens=np.array([e.num_tokens for e in entries], dtype="<u8").tobytes(),
        block_sizes=np.array([e.block_size for e in entries], dtype="<u2").tobytes(),
        registered_at=heads["registered_at"].astype("<f8").tobytes(),
        block_counts=(heads["hashes_end"] // 8).astype("<u4").tobytes(),
        block_hashes=np.frombuffer(hashes, dtype="=u8").astype("<u8").tobytes(),
        embedding_dims=heads["embedding_dim"].astype("<u2").tobytes(),
        embedding_codes=heads["codes"].tobytes(),
        embeddings=b"".join(
            [
                blob[end:] if embedding is None else embedding
                for blob, end, embedding in zip(blobs, ends, embeddings, strict=True)
            ]
        ),
    )


_REGISTRATION_SLOTS = tuple(name for name in DonorEntry.__slots__ if name not in ("blob", "missing", "worker"))


def _worker_groups(entries: list[DonorEntry]) -> list[list[int]]:
    """The positions of ``entries`` grouped by worker (each group in order, the groups in order of their first entry).
    An entry's worker key is its worker's shared tuple (:meth:`Residency._blocks`), so the keys' identities tell the
    workers apart: a large batch is grouped with a few numpy calls instead of a dict append per entry."""
    if len(entries) < 256:
        groups: dict[WorkerKey, list[int]] = {}
        for at, entry in enumerate(entries):
            groups.setdefault(entry.worker, []).append(at)
        return list(groups.values())
    workers = np.fromiter(map(id, map(_WORKER, entries)), dtype=np.int64, count=len(entries))
    order = np.argsort(workers, kind="stable")
    ordered = workers[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    ends = [*starts[1:].tolist(), len(entries)]
    picks = order.tolist()
    spans = sorted(zip(order[starts].tolist(), starts.tolist(), ends, strict=True))  # by first entry
    return [picks[start:end] for _, start, end in spans]


def _segments(lengths: np.ndarray, picks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For rows ``picks`` of items laid end to end (row ``i`` ``lengths[i]`` long): their lengths and the positions
    of their items, row after row."""
    if len(picks) == len(lengths):  # every row, in order (positions from _worker_groups are ascending)
        return lengths, np.arange(int(lengths.sum()))
    rows = np.array(picks, dtype=np.intp)
    picked = lengths[rows]
    firsts = (np.cumsum(lengths) - lengths)[rows]
    return picked, np.repeat(firsts - (np.cumsum(picked) - picked), picked) + np.arange(int(picked.sum()))


def _ints(values: Sequence[int], dtype: type = np.uint64) -> np.ndarray:
    """``values`` as an integer array (a range without a Python int a value)."""
    if isinstance(values, range):
        return np.arange(values.start, values.stop, values.step, dtype=dtype)
    return np.array(values, dtype=dtype)


def _joined_rows(parts: list[np.ndarray]) -> np.ndarray:
    """Parts' block hashes as one array: one row a donor where every part holds rows of one width, else end to end."""
    if all(part.ndim == 2 for part in parts) and len({part.shape[1] for part in parts}) == 1:
        return np.concatenate(parts)
    return np.concatenate([part.ravel() for part in parts])


def _fixed_blobs(
    rows: SyncRows, at: np.ndarray, block_hashes: np.ndarray, heads: np.ndarray, embedding_bytes: int
) -> list[bytes]:
    """The blobs (:class:`DonorEntry`) of rows ``at`` of a page whose rows all have as many hashes (``block_hashes``:
    theirs, one row a donor) and ``embedding_bytes`` embedding bytes (:attr:`SyncRows.row_sizes`): one array of all the
    blobs, cut into one ``bytes`` a donor (instead of three slices and a join a donor). ``heads``: theirs. (The
    compiled entries write the same blobs straight from the page: ``_native/entries.c``.)"""
    embeddings = np.frombuffer(rows.embeddings, dtype=np.uint8).reshape(-1, embedding_bytes)[at]
    hashes_end = BLOB_HEAD + block_hashes.shape[1] * 8
    blobs = np.empty((len(at), hashes_end + embedding_bytes), dtype=np.uint8)
    blobs[:, :BLOB_HEAD] = heads.view(np.uint8).reshape(len(at), BLOB_HEAD)
    blobs[:, BLOB_HEAD:hashes_end] = block_hashes.view(np.uint8)
    blobs[:, hashes_end:] = embeddings
    return cast(list[bytes], blobs.view(np.dtype((np.void, blobs.shape[1]))).ravel().tolist())


NATIVE_ENTRIES, NATIVE_ENTRIES_REASON = native_entries.use((DonorEntry, BLOB_HEAD))
"""The compiled entries (:mod:`semblend_dynamo.native_entries`) and why they are (not) used."""


class Residency:
    """Per-worker block presence from kv-events plus the donor catalog and its resident sets.

    Residency changes are also queued as ``(donor_id, resident)`` pairs; the owner takes them with
    :meth:`take_changes` after each batch (to add donors to, or drop them from, the search index). Each donor has
    a slot (its index in ``_slots``, reused once it leaves): postings name donors by slot. ``codes``: donors keep
    their embeddings as int8 codes (the catalog's index is i8), else float16.
    """

    def __init__(self, capacity: int, *, codes: bool = False) -> None:
        self.capacity = capacity
        self.codes = codes
        self._workers: dict[WorkerKey, _WorkerBlocks] = {}
        # A plain dict (an OrderedDict's links cost ~48 B a donor); the add order is kept for eviction in _order: the
        # entries from _order_head on in the order they were taken, an entry no longer the donor's (replaced or
        # removed) skipped and dropped when they are many. 8 bytes a donor.
        self._donors: dict[str, DonorEntry] = {}
        self._order: list[DonorEntry] = []
        self._order_head = 0
        self._slots: list[DonorEntry | None] = []
        self._free: list[int] = []
        self._resident_counts: Counter[str] = Counter()  # resident donors per namespace
        self._worker_donors: Counter[WorkerKey] = Counter()  # donors per worker rank (no key at 0)
        self._worker_resident: Counter[WorkerKey] = Counter()  # resident donors per worker rank
        self._changes: list[tuple[str, bool]] = []
        self.event_gaps = 0
        self.ignored_events: Counter[str] = Counter()

    def _blocks(self, key: WorkerKey) -> _WorkerBlocks:
        blocks = self._workers.get(key)
        if blocks is None:
            blocks = self._workers[key] = _WorkerBlocks(key)
        return blocks

    # --- kv-events -------------------------------------------------------------------------------
    def apply(self, event: KvEvent) -> None:
        """Called for every decoded kv-event, in arrival order (the router's hot ingest path)."""
        blocks = self._receive(event)
        if blocks is None:
            return
        data = event.data
        if isinstance(data, KvStored):
            self._store(blocks, data.block_hashes, data.tokens_hashes)
        elif isinstance(data, KvRemoved):
            removed = blocks.by_block.pop_many(data.block_hashes)
            gone = [h for h in removed if h is not None]
            self.ignored_events["unknown_block"] += len(removed) - len(gone)
            self._drop_hashes(blocks, gone)
        elif isinstance(data, KvCleared):
            keys, values = blocks.hashes.arrays()
            postings = values & np.uint64(_POST_MASK)
            posted = postings > 0
            stored = posted & (values > postings)
            for tokens_hash, posting in zip(keys[stored].tolist(), postings[stored].tolist(), strict=True):
                self._hash_left(blocks.slots(tokens_hash, posting))
            blocks.by_block.clear()
            blocks.hashes.clear()
            blocks.hashes.assign(keys[posted], postings[posted])

    def _receive(self, event: KvEvent) -> _WorkerBlocks | None:
        """Note an event's id on its worker's blocks (counting a gap); those blocks, or None for another tier."""
        if event.storage_tier != DEVICE_TIER:
            self.ignored_events["storage_tier"] += 1
            return None
        blocks = self._blocks((event.worker_id, event.dp_rank))
        if blocks.last_event_id and event.event_id > blocks.last_event_id + 1:
            self.event_gaps += 1
        if event.event_id > blocks.last_event_id:
            blocks.last_event_id = event.event_id
        return blocks

    def _store(self, blocks: _WorkerBlocks, block_hashes: Sequence[int], tokens_hashes: Sequence[int]) -> None:
        if len(block_hashes) != len(tokens_hashes):
            raise ValueError("block_hashes and tokens_hashes differ in length")
        if self._store_new(blocks, block_hashes, tokens_hashes):
            return
        by_block = blocks.by_block
        previous = by_block.get_many(block_hashes)
        distinct = len(set(block_hashes)) == len(block_hashes)
        if distinct and any(p is not None for p in previous):  # blocks stored again as they are change nothing
            kept = [i for i, (p, t) in enumerate(zip(previous, tokens_hashes, strict=True)) if p != t]
            block_hashes = [block_hashes[i] for i in kept]
            tokens_hashes = [tokens_hashes[i] for i in kept]
            previous = [previous[i] for i in kept]
        if any(p is not None for p in previous) or not distinct:
            for block_hash, tokens_hash in zip(block_hashes, tokens_hashes, strict=True):  # re-stores: in turn
                held = by_block.get(block_hash)
                if held == tokens_hash:
                    continue
                if held is not None:
                    self._drop_hashes(blocks, [held])
                by_block[block_hash] = tokens_hash
                self._add_hashes(blocks, [tokens_hash])
            return
        by_block.set_many(block_hashes, tokens_hashes, previous)
        self._add_hashes(blocks, tokens_hashes)

    def _store_new(self, blocks: _WorkerBlocks, block_hashes: Sequence[int], tokens_hashes: Sequence[int]) -> bool:
        """:meth:`_store` in a few array operations when the blocks are distinct and none is stored on the worker, and
        their hashes distinct (a finished prompt's usual event); False, doing nothing, otherwise. As
        :meth:`_post_new`: sorted probes, each map looked up then assigned the same sorted array."""
        if len(block_hashes) < _ARRAY_STORE:
            return False
        tokens = np.array(tokens_hashes, dtype=np.uint64)
        tokens_order = np.argsort(tokens)
        ordered = tokens[tokens_order]
        if (ordered[1:] == ordered[:-1]).any():
            return False
        engine = np.array(block_hashes, dtype=np.uint64)
        engine_order = np.argsort(engine)
        engine_ordered = engine[engine_order]
        if (engine_ordered[1:] == engine_ordered[:-1]).any() or blocks.by_block.lookup(engine_ordered)[0].any():
            return False
        blocks.by_block.assign(engine_ordered, tokens[engine_order])
        values = blocks.hashes.lookup(ordered)[1]
        blocks.hashes.assign(ordered, values + np.uint64(1 << _POST_BITS))
        arrived = (values != 0) & (values <= _POST_MASK)  # posted, and stored by no block until now
        if not arrived.any():
            return True
        in_turn = np.argsort(tokens_order[arrived])  # in the event's order, as _add_hashes meets them
        postings = values[arrived][in_turn]
        if (postings == SHARED).any():
            hashes = ordered[arrived][in_turn].tolist()
            slots = np.array(
                [slot for h, p in zip(hashes, postings.tolist(), strict=True) for slot in blocks.slots(h, p)],
                dtype=np.int64,
            )
        else:
            slots = postings.astype(np.int64) - 1
        # a donor becomes resident at its last hash arriving (its ``missing`` counts at least its arrivals)
        distinct, last, counts = np.unique(slots[::-1], return_index=True, return_counts=True)
        by_last = np.argsort(-last)
        resident = []
        for slot, count in zip(distinct[by_last].tolist(), counts[by_last].tolist(), strict=True):
            entry = self._slots[slot]
            assert entry is not None
            entry.missing -= count
            if entry.missing == 0:
                resident.append(entry)
        self._became_resident(resident, blocks.key)
        return True

    def _add_hashes(self, blocks: _WorkerBlocks, tokens_hashes: Sequence[int]) -> None:
        """One more engine block holds each of ``tokens_hashes`` (a hash may repeat)."""
        added = Counter(tokens_hashes)
        keys = list(added)
        held = blocks.hashes.get_many(keys)
        blocks.hashes.set_many(
            keys, [(h or 0) + (added[k] << _POST_BITS) for k, h in zip(keys, held, strict=True)], held
        )
        for tokens_hash, value in zip(keys, held, strict=True):
            if value is not None and value <= _POST_MASK:  # posted, and stored by no block until now
                self._hash_arrived(blocks.slots(tokens_hash, value))

    def _drop_hashes(self, blocks: _WorkerBlocks, tokens_hashes: Sequence[int]) -> None:
        """One engine block fewer holds each of ``tokens_hashes`` (a hash may repeat)."""
        if not tokens_hashes:
            return
        dropped = Counter(tokens_hashes)
        keys = list(dropped)
        kept: list[int] = []
        values: list[int] = []
        gone: list[int] = []
        left: list[tuple[int, int]] = []
        for tokens_hash, value in zip(keys, blocks.hashes.get_many(keys), strict=True):
            if value is None or value <= _POST_MASK:
                continue
            posting = value & _POST_MASK
            if value >> _POST_BITS > dropped[tokens_hash]:
                kept.append(tokens_hash)
                values.append(value - (dropped[tokens_hash] << _POST_BITS))
            elif posting:
                kept.append(tokens_hash)
                values.append(posting)
                left.append((tokens_hash, posting))
            else:
                gone.append(tokens_hash)
        blocks.hashes.set_many(kept, values, kept)
        blocks.hashes.pop_many(gone)
        for tokens_hash, posting in left:
            self._hash_left(blocks.slots(tokens_hash, posting))

    def reconcile(self, events: Iterable[KvEvent]) -> int:
        """Make every worker's device blocks exactly those of a full index dump; returns the blocks that changed.

        The zmq event plane's path (:mod:`~semblend_dynamo.router.kv_ingest`): the dump of Dynamo's own KV
        index is the whole truth, so a block missing from it was removed (or its worker left).
        """
        snapshot: dict[WorkerKey, dict[int, int]] = {}
        for event in events:
            if event.storage_tier == DEVICE_TIER and isinstance(event.data, KvStored):
                stored = snapshot.setdefault((event.worker_id, event.dp_rank), {})
                stored.update(zip(event.data.block_hashes, event.data.tokens_hashes, strict=True))
        changed = 0
        for key in sorted(set(self._workers) | set(snapshot)):
            blocks = self._blocks(key)
            now = snapshot.get(key, {})
            gone = [b for b, tokens_hash in blocks.by_block.items() if now.get(b) != tokens_hash]
            self._drop_hashes(blocks, [h for h in blocks.by_block.pop_many(gone) if h is not None])
            new = [b for b, held in zip(now, blocks.by_block.get_many(list(now)), strict=True) if held is None]
            self._store(blocks, new, [now[b] for b in new])
            changed += len(gone) + len(new)
        return changed

    def merge_dump(self, events: Iterable[KvEvent]) -> None:
        """Add what a full dump (Dynamo's recovered index, ``KvRouter.dump_events()``) holds.

        Called after a (re)connect or an event-id gap, to recover stored blocks the live stream missed. It
        only adds: Dynamo's index may lag the stream, so blocks the stream showed are not dropped here
        (removals missed during an outage surface as connector declines, which drop the donor).
        """
        pending: dict[WorkerKey, tuple[list[int], list[int]]] = {}
        try:
            for event in events:
                data = event.data
                if isinstance(data, KvStored) and (blocks := self._receive(event)) is not None:
                    if len(data.block_hashes) != len(data.tokens_hashes):
                        raise ValueError("block_hashes and tokens_hashes differ in length")
                    block_hashes, tokens_hashes = pending.setdefault(blocks.key, ([], []))
                    block_hashes += data.block_hashes
                    tokens_hashes += data.tokens_hashes
        finally:  # a worker's stores taken together end as they would one by one (they touch its blocks only)
            for key, (block_hashes, tokens_hashes) in pending.items():
                self._store(self._workers[key], block_hashes, tokens_hashes)

    def _hash_arrived(self, slots: Collection[int]) -> None:
        for slot in slots:
            entry = self._slots[slot]
            assert entry is not None
            entry.missing -= 1
            if entry.missing == 0:
                self._became_resident((entry,))

    def _hash_left(self, slots: Collection[int]) -> None:
        for slot in slots:
            entry = self._slots[slot]
            assert entry is not None
            entry.missing += 1
            if entry.missing == 1:
                self._resident_counts[entry.namespace] -= 1
                self._worker_resident[entry.worker] -= 1
                self._changes.append((entry.donor_id, False))

    def _became_resident(self, entries: Collection[DonorEntry], worker: WorkerKey | None = None) -> None:
        """``entries`` are resident now (``worker``: the worker of every one of them, if known)."""
        self._resident_counts.update(map(_NAMESPACE, entries))
        if worker is None:
            self._worker_resident.update(map(_WORKER, entries))
        elif entries:
            self._worker_resident[worker] += len(entries)
        self._changes += zip(map(_DONOR_ID, entries), repeat(True))

    def _block_maps(self) -> Iterator[U64Map]:
        for blocks in self._workers.values():
            yield blocks.by_block
            yield blocks.hashes

    def rewrite_left(self) -> int:
        """Entries the block maps' base rewrites in progress have still to write."""
        return sum(m.rewrite_left for m in self._block_maps())

    def settle(self, entries: int) -> tuple[int, int]:
        """Write up to ``entries`` (and the frozen entries of their ranges) of the block maps' base rewrites left in
        progress (:meth:`U64Map.settle`): ``(written, left)`` over every worker's maps."""
        written = left = 0
        for blocks_map in self._block_maps():
            done, rest = blocks_map.settle(entries - written) if written < entries else (0, blocks_map.rewrite_left)
            written += done
            left += rest
        return written, left

    def take_changes(self) -> list[tuple[str, bool]]:
        """``(donor_id, now_resident)`` transitions since the last call, in order."""
        changes, self._changes = self._changes, []
        return changes

    # --- donors ----------------------------------------------------------------------------------
    def add_donor(self, registration: DonorRegistration) -> list[str]:
        """Add (or refresh) a donor; returns the donor ids pushed out by the capacity bound.

        A donor whose blocks are all present already becomes resident at once (a ``(donor_id, True)`` change).
        """
        return self.add_many([registration])

    def add_many(self, registrations: Iterable[DonorRegistration]) -> list[str]:
        """:meth:`add_donor` for many registrations (of distinct donors or not), each worker's postings and block
        presence looked up once for all of its donors; returns the donor ids pushed out by the capacity bound."""
        regs = list(registrations)
        embeddings, forms = stored_forms(
            [r.embedding for r in regs], [r.embedding_dim for r in regs], [False] * len(regs), self.codes
        )
        return self._insert(
            [
                DonorEntry.of(r, self._blocks((r.worker_id, r.dp_rank)).key, embedding, form)
                for r, embedding, form in zip(regs, embeddings, forms, strict=True)
            ]
        )

    def add_rows(
        self,
        parts: Iterable[tuple[SyncRows, Sequence[int]]],
        *,
        new: bool = False,
        ids: Sequence[str] | None = None,
    ) -> tuple[list[DonorEntry], list[str]]:
        """:meth:`add_many` for rows of sync pages, taken from their columns (no registration objects): each part is
        a page's rows and the rows of it to take. ``new``: the caller knows that no donor is known or repeats; ``ids``
        (with ``new``): the donor ids of the rows taken, in order, if the caller has them. Returns the entries taken
        (in order) and the donor ids pushed out by the capacity bound."""
        parts = list(parts)
        entries: list[DonorEntry] = []
        if not new:
            for rows, picked in parts:
                entries += self._entries(rows, picked, None)
            return entries, self._insert(entries)
        taken = self._reserve(sum(len(picked) for _, picked in parts))  # in the blobs as they are built
        hashes: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        try:
            at = 0
            for rows, picked in parts:
                end = at + len(picked)
                entries += self._entries(
                    rows, picked, taken[at:end], hashes, lengths, None if ids is None else ids[at:end]
                )
                at = end
        except BaseException:
            self._unreserve(taken)
            raise
        columns = (_joined_rows(hashes), np.concatenate(lengths), _ints(taken))
        return entries, self._insert(
            entries, new=True, slotted=taken, columns=columns, ids=None if ids is None else list(ids)
        )

    def _entries(
        self,
        rows: SyncRows,
        picked: Sequence[int],
        slots: Sequence[int] | None,
        hashes: list[np.ndarray] | None = None,
        lengths: list[np.ndarray] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[DonorEntry]:
        """The entries of rows ``picked`` of a sync page, built column by column (``slots``: theirs, reserved; ``ids``:
        their donor ids, if known); their block hashes are appended to ``hashes`` (end to end, or one row a donor when
        every donor has as many) and their counts to ``lengths`` if given."""
        take = SyncRows.picker(picked)
        dims, forms = take(rows.embedding_dims), take(rows.embedding_codes)
        convert = bool(forms.count(not self.codes))  # a peer that keeps the other form (or sent an empty embedding so)
        sizes = rows.row_sizes
        fixed = sizes is not None and sizes[0] and sizes[1] and picked and not convert  # the usual page
        worker_ids, dp_ranks = take(rows.worker_ids), take(rows.dp_ranks)
        workers: Sequence[Hashable] = worker_ids  # each donor's worker key, or (every rank 0, the usual) its worker id
        keys: dict[Hashable, WorkerKey]
        if any(dp_ranks):
            pairs = list(zip(worker_ids, dp_ranks, strict=True))
            keys = {key: self._blocks(key).key for key in dict.fromkeys(pairs)}
            workers = pairs
        else:
            keys = {worker: self._blocks((worker, 0)).key for worker in dict.fromkeys(worker_ids)}
        if fixed:
            assert sizes is not None
            at = _ints(picked, np.int64)
            block_hashes = np.frombuffer(rows.block_hashes, dtype=np.uint64).reshape(-1, sizes[0])[at]
            if hashes is not None and lengths is not None:
                hashes.append(block_hashes)
                lengths.append(np.full(len(picked), sizes[0], dtype=np.int64))
            if NATIVE_ENTRIES is not None and workers is worker_ids:  # the entries and blobs in C
                return cast(
                    list[DonorEntry],
                    NATIVE_ENTRIES(
                        at.tolist(),
                        None if ids is None else list(ids),
                        rows.donor_ids,
                        rows.donor_keys,
                        rows.router_ids,
                        rows.worker_ids,
                        keys,
                        sys.intern(rows.deployment),
                        rows.namespaces,
                        rows.num_tokens,
                        rows.block_sizes,
                        sys.intern,
                        _shared_int,
                        rows.block_hashes,
                        sizes[0],
                        rows.embeddings,
                        sizes[1],
                        rows.registered_at,
                        rows.embedding_dims,
                        rows.embedding_codes,
                        np.full(len(picked), NO_SLOT, dtype=np.uint32) if slots is None else _ints(slots, np.uint32),
                    ),
                )
        heads = np.empty(len(picked), dtype=_HEAD)
        heads["slot"] = NO_SLOT if slots is None else _ints(slots)
        heads["registered_at"] = take(rows.registered_at)
        heads["embedding_dim"] = dims
        heads["codes"] = forms
        blobs: Iterable[bytes]
        if fixed:
            assert sizes is not None
            heads["hashes_end"] = 8 * sizes[0]
            blobs = _fixed_blobs(rows, at, block_hashes, heads, sizes[1])
        else:
            blobs = self._joined_blobs(rows, take, heads, dims, forms, convert, hashes, lengths)
        return list(
            map(
                DonorEntry,
                take(rows.donor_ids) if ids is None else ids,
                take(rows.donor_keys),
                _shared(take(rows.router_ids), sys.intern),
                map(keys.__getitem__, workers),
                repeat(sys.intern(rows.deployment)),
                _shared(take(rows.namespaces), sys.intern),
                _shared(take(rows.num_tokens), _shared_int),
                _shared(take(rows.block_sizes), _shared_int),
                blobs,
            )
        )

    def _joined_blobs(
        self,
        rows: SyncRows,
        take: RowPicker,
        heads: np.ndarray,
        dims: list[int],
        forms: list[bool],
        convert: bool,
        hashes: list[np.ndarray] | None,
        lengths: list[np.ndarray] | None,
    ) -> Iterable[bytes]:
        """The blobs of :meth:`_entries` joined donor by donor, for rows of any sizes (``take``: their picker; embeddings
        of the other form converted if ``convert``); ``heads`` gets their ``hashes_end`` (and forms)."""
        hash_ends = np.array(take(rows.hash_ends), dtype=np.int64) * 8
        hash_starts = np.array(take(rows.hash_starts), dtype=np.int64) * 8
        heads["hashes_end"] = hash_ends - hash_starts
        embedding_starts, embedding_ends = take(rows.embedding_starts), take(rows.embedding_ends)
        hash_bytes = rows.block_hashes.tobytes()  # the page's (~128 KB): its slices are bytes, joined to embeddings
        embeddings: Iterable[bytes] = map(rows.embeddings.__getitem__, map(slice, embedding_starts, embedding_ends))
        if convert:
            embeddings, forms = stored_forms(list(embeddings), dims, forms, self.codes)
            heads["codes"] = forms
        head_bytes = heads.tobytes()
        starts = range(0, len(head_bytes), BLOB_HEAD)
        hash_parts = list(map(hash_bytes.__getitem__, map(slice, hash_starts.tolist(), hash_ends.tolist())))
        if hashes is not None and lengths is not None:
            hashes.append(np.frombuffer(b"".join(hash_parts), dtype=np.uint64))
            lengths.append((hash_ends - hash_starts) // 8)
        return map(
            b"".join,
            zip(
                map(head_bytes.__getitem__, map(slice, starts, range(BLOB_HEAD, len(head_bytes) + 1, BLOB_HEAD))),
                hash_parts,
                embeddings,
                strict=True,
            ),
        )

    def _insert(
        self,
        entries: list[DonorEntry],
        *,
        new: bool = False,
        slotted: Sequence[int] | None = None,
        columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        ids: list[str] | None = None,
    ) -> list[str]:
        """Take new entries (replacing known donors of the same ids), post them per worker, evict past capacity;
        ``new``: no entry's donor is known or repeats (checked here otherwise); ``slotted``: (with ``new``) the slots
        reserved for the entries (:meth:`_reserve`), which they carry; ``columns``: (with ``slotted``) the entries'
        block hashes (end to end, or one row an entry when all have as many), their counts and the slots as arrays
        (what their blobs hold); ``ids``: the entries' donor ids, if known."""
        donors = self._donors
        if ids is None:
            ids = list(map(_DONOR_ID, entries))
        by_group = slotted is not None  # donors counted per worker group below
        if slotted is not None:
            slots = self._slots
            if isinstance(slotted, range) and slotted.step == 1:  # slots new at the end (none freed to reuse)
                if len(slotted) != len(entries):
                    raise ValueError("slots and entries differ in number")
                slots[slotted.start : slotted.stop] = entries
            else:
                for slot, entry in zip(slotted, entries, strict=True):
                    slots[slot] = entry
            donors.update(zip(ids, entries, strict=True))
            new = True
        elif new or (len(set(ids)) == len(ids) and not any(map(donors.__contains__, ids))):  # a sync page's usual
            self._take_slots(entries)
            donors.update(zip(ids, entries, strict=True))
            self._worker_donors.update(map(_WORKER, entries))
            new = True
        else:
            for entry in entries:
                donor_id = entry.donor_id
                if donor_id in donors:
                    self.remove_donor(donor_id)
                self._take_slots([entry])
                donors[donor_id] = entry
                self._worker_donors[entry.worker] += 1
        for picks in _worker_groups(entries):
            group = list(map(entries.__getitem__, picks))
            blocks = self._workers[group[0].worker]
            if by_group:
                self._worker_donors[blocks.key] += len(group)
            if columns is not None:
                if columns[0].ndim == 2:  # one row of hashes an entry
                    every = len(picks) == len(entries)
                    hashes = (columns[0] if every else columns[0][picks]).ravel()
                    lengths = columns[1] if every else columns[1][picks]
                else:
                    lengths, positions = _segments(columns[1], picks)
                    hashes = columns[0][positions]
                if self._post_new(blocks, group, (hashes, lengths, columns[2][picks])):
                    continue
            self._post(blocks, group, replaced=not new)
        self._order += entries
        evicted = []
        while len(donors) > self.capacity:
            oldest = self._oldest()
            self.remove_donor(oldest)
            evicted.append(oldest)
        self._compact_order()
        return evicted

    def _oldest(self) -> str:
        """The donor added longest ago (and not added again since); there is one."""
        order, donors = self._order, self._donors
        while True:
            entry = order[self._order_head]
            self._order_head += 1
            if donors.get(entry.donor_id) is entry:
                return entry.donor_id

    def _compact_order(self) -> None:
        """Drop the add order's records of entries gone or replaced once they outnumber the donors (amortized O(1); on
        adds only, so removals under a bulk write such as a kv-event batch never pay for a rebuild)."""
        order, head = self._order, self._order_head
        if head > 1024 and head * 2 > len(order):
            del order[:head]
            self._order_head = head = 0
        if len(order) > 2 * len(self._donors) + 1024:
            live = order[head:]
            self._order = list(compress(live, self.current(live)))
            self._order_head = 0

    def _post(self, blocks: _WorkerBlocks, entries: list[DonorEntry], *, replaced: bool = True) -> None:
        """Post new donors' hashes on their worker (one lookup and one write for all) and count the ones not stored
        there; an entry replaced later in the same batch is skipped (``replaced``: the batch may hold such)."""
        if replaced:
            entries = [entry for entry in entries if self._slots[entry.slot] is entry]
        if self._post_new(blocks, entries):
            return
        wanted = [dict.fromkeys(entry.block_hashes) for entry in entries]
        hashes = list(dict.fromkeys(h for distinct in wanted for h in distinct))
        was = dict(zip(hashes, blocks.hashes.get_many(hashes), strict=True))
        posting: dict[int, int] = {}
        for entry, distinct in zip(entries, wanted, strict=True):
            mine = entry.slot + 1
            for tokens_hash in distinct:
                held = posting.get(tokens_hash)
                if held is None:
                    held = (was[tokens_hash] or 0) & _POST_MASK
                if not held:
                    posting[tokens_hash] = mine
                elif held == SHARED:
                    blocks.shared[tokens_hash].add(entry.slot)
                elif held != mine:
                    posting[tokens_hash] = SHARED
                    blocks.shared[tokens_hash] = {held - 1, entry.slot}
            entry.missing = sum(1 for h in distinct if (was[h] or 0) <= _POST_MASK)
            if entry.missing == 0:
                self._became_resident((entry,))
        changed = [h for h, held in posting.items() if held != (was[h] or 0) & _POST_MASK]
        blocks.hashes.set_many(
            changed,
            [(was[h] or 0) - ((was[h] or 0) & _POST_MASK) + posting[h] for h in changed],
            [was[h] for h in changed],
        )

    def _post_new(
        self,
        blocks: _WorkerBlocks,
        entries: list[DonorEntry],
        columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> bool:
        """:meth:`_post` in a few array operations when every hash of ``entries`` is distinct and posted by no donor
        yet (a sync page's usual donors); False, doing nothing, otherwise. ``columns``: the entries' hashes end to
        end, their counts and their slots, if known (else read from their blobs)."""
        if columns is None:
            heads = _heads(entries)
            ends = heads["hashes_end"].tolist()
            lengths = heads["hashes_end"].astype(np.int64) // 8
            if not len(entries) or not lengths.all():
                return False
            blobs = map(_BLOB, entries)
            hashes = np.frombuffer(
                b"".join(map(getitem, blobs, map(slice, repeat(BLOB_HEAD), [BLOB_HEAD + e for e in ends]))),
                dtype=np.uint64,
            )
            slots = heads["slot"].astype(np.uint64)
        else:
            hashes, lengths, slots = columns
            if not len(entries) or not lengths.all():
                return False
        order = np.argsort(hashes)  # sorted probes: fewer cache misses in the map's binary searches
        ordered = hashes[order]
        if (ordered[1:] == ordered[:-1]).any():
            return False
        values = blocks.hashes.lookup(ordered)[1]
        if (values & np.uint64(_POST_MASK)).any():
            return False
        postings = slots + np.uint64(1)
        blocks.hashes.assign(ordered, values | np.repeat(postings, lengths)[order])
        if values.all():  # every hash stored on the worker (blocks recovered before the sync): all resident
            for entry in entries:
                entry.missing = 0
            self._became_resident(entries, blocks.key)
            return True
        absent = np.empty(len(hashes), dtype=bool)
        absent[order] = values == 0  # no block stores it (its posting is 0 too)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        resident = []
        for entry, missing in zip(entries, np.add.reduceat(absent, starts).tolist(), strict=True):
            entry.missing = missing
            if missing == 0:
                resident.append(entry)
        self._became_resident(resident, blocks.key)
        return True

    def _take_slots(self, entries: list[DonorEntry]) -> None:
        """Give each entry a slot (freed ones first, most recently freed first) and hold it there."""
        slots = self._slots
        for entry, slot in zip(entries, self._reserve(len(entries)), strict=True):
            entry.slot = slot
            slots[slot] = entry

    def _reserve(self, count: int) -> Sequence[int]:
        """``count`` slots for new entries (freed ones first, most recently freed first); held empty until taken."""
        free, slots = self._free, self._slots
        reused = min(len(free), count)
        taken = [free.pop() for _ in range(reused)]
        grown = count - reused
        if len(slots) + grown > MAX_SLOTS:
            free.extend(reversed(taken))
            raise OverflowError(f"residency holds {MAX_SLOTS} donor slots already")
        if not reused:  # a range: its slots are taken with a slice (:meth:`_insert`), not one by one
            fresh = range(len(slots), len(slots) + grown)
            slots += [None] * grown
            return fresh
        taken += range(len(slots), len(slots) + grown)
        slots += [None] * grown
        return taken

    def _unreserve(self, taken: Sequence[int]) -> None:
        """Give back slots :meth:`_reserve` handed out and no entry took."""
        self._free.extend(reversed(taken))

    def remove_donor(self, donor_id: str) -> bool:
        """Forget a donor (no change is queued: the caller knows)."""
        entry = self._donors.pop(donor_id, None)
        if entry is None:
            return False
        blocks = self._workers.get(entry.worker)
        if blocks is not None:
            for tokens_hash in set(entry.block_hashes):
                blocks.unpost(tokens_hash, entry.slot)
        self._slots[entry.slot] = None
        self._free.append(entry.slot)
        if entry.missing == 0:
            self._resident_counts[entry.namespace] -= 1
            self._worker_resident[entry.worker] -= 1
        self._worker_donors[entry.worker] -= 1
        if not self._worker_donors[entry.worker]:
            del self._worker_donors[entry.worker]
            self._worker_resident.pop(entry.worker, None)
        return True

    # --- workers ---------------------------------------------------------------------------------
    def retain_workers(self, live_worker_ids: Collection[int]) -> list[str]:
        """Forget every worker not in ``live_worker_ids`` (discovery changed); returns the donors removed."""
        # called every discovery poll: per-worker counts, never a walk over the donors
        gone = {key for key in (*self._workers, *self._worker_donors) if key[0] not in live_worker_ids}
        removed: list[str] = []
        for key in gone:
            removed += self.remove_worker(key)
        return removed

    def remove_worker(self, key: WorkerKey) -> list[str]:
        """A worker (rank) left: drop its blocks and its donors."""
        self._workers.pop(key, None)
        doomed = [d for d, entry in self._donors.items() if entry.worker == key]
        for donor_id in doomed:
            self.remove_donor(donor_id)
        return doomed

    # --- queries ---------------------------------------------------------------------------------
    def resident(self, namespace: str) -> set[str]:
        """Donor ids resident now in ``namespace`` (a scan of every donor: for debugging and tests)."""
        return {e.donor_id for e in self._donors.values() if e.missing == 0 and e.namespace == namespace}

    def resident_count(self, namespace: str) -> int:
        """How many donors are resident now in ``namespace``."""
        return self._resident_counts[namespace]

    def is_resident(self, donor_id: str) -> bool:
        entry = self._donors.get(donor_id)
        return entry is not None and entry.missing == 0

    def donor(self, donor_id: str) -> DonorEntry | None:
        return self._donors.get(donor_id)

    def donors_of(self, donor_ids: Iterable[str]) -> list[DonorEntry | None]:
        """:meth:`donor` of each id."""
        return list(map(self._donors.get, donor_ids))

    def current(self, entries: Sequence[DonorEntry]) -> list[bool]:
        """Whether each entry is still its donor's (not replaced or removed since it was taken)."""
        return list(map(is_, map(self._donors.get, map(_DONOR_ID, entries)), entries))

    def entries(self, donor_ids: Iterable[str]) -> list[DonorEntry]:
        """The entries of donors known to be held (KeyError otherwise)."""
        return list(map(self._donors.__getitem__, donor_ids))

    def knows_any(self, donor_ids: Iterable[str]) -> bool:
        return not self._donors.keys().isdisjoint(donor_ids)

    def donors(self) -> Iterable[DonorEntry]:
        return self._donors.values()

    def __len__(self) -> int:
        return len(self._donors)

    def __contains__(self, donor_id: object) -> bool:
        return donor_id in self._donors

    def stored_together(self, tokens_hashes: Sequence[int]) -> bool:
        """Whether some worker rank stores a block of each of ``tokens_hashes`` on its device tier (at any position:
        a ``tokens_hash`` does not depend on the blocks before it). A few ``U64Map`` reads a rank, all in one compiled
        call where it is built (:data:`~semblend_dynamo.router.u64map.NATIVE_GATE`; the exact-wins gate's read on
        every request, ~20-30 µs in Python with the caches cold)."""
        if NATIVE_GATE is not None:
            return NATIVE_GATE(self._workers, tokens_hashes, _POST_MASK, False)  # type: ignore[no-any-return]
        return self._stored_together_python(tokens_hashes)

    def _stored_together_python(self, tokens_hashes: Sequence[int]) -> bool:
        """:meth:`stored_together` in Python (the compiled gate's reference)."""
        for blocks in self._workers.values():
            hashes = blocks.hashes
            if all((hashes.get(h) or 0) > _POST_MASK for h in tokens_hashes):
                return True
        return False

    def read_stored_together(self, tokens_hashes: Sequence[int]) -> bool | None:
        """:meth:`stored_together` for a reader that does not hold the owner's lock while another thread may change
        the residency: None if a block map it needed changed during its reads (each map tells, :meth:`U64Map.quiet`);
        a rank whose map answered without a change overlapping its reads counts. In one compiled call where it is built
        (it holds the GIL: a map quiet when it starts its reads stays so to their end)."""
        if NATIVE_GATE is not None:
            return NATIVE_GATE(self._workers, tokens_hashes, _POST_MASK, True)  # type: ignore[no-any-return]
        return self._read_stored_together_python(tokens_hashes)

    def _read_stored_together_python(self, tokens_hashes: Sequence[int]) -> bool | None:
        """:meth:`read_stored_together` in Python (the compiled gate's reference)."""
        unsure = False
        for blocks in list(self._workers.values()):  # a copy: another thread may add a worker rank meanwhile
            hashes = blocks.hashes
            before = hashes.quiet()
            try:
                stored = before is not None and all((hashes.get(h) or 0) > _POST_MASK for h in tokens_hashes)
            except (IndexError, ValueError, RuntimeError):  # levels replaced under the read: it did not see one map
                stored = False
            if before is None or hashes.quiet() != before:
                unsure = True
            elif stored:
                return True
        return None if unsure else False

    def blocks_on(self, key: WorkerKey) -> int:
        blocks = self._workers.get(key)
        return 0 if blocks is None else len(blocks.by_block)

    def workers(self) -> list[WorkerKey]:
        return sorted(set(self._workers) | {entry.worker for entry in self._donors.values()})

    def donors_per_worker(self) -> dict[WorkerKey, tuple[int, int]]:
        """``(donors, resident donors)`` per worker rank."""
        return {key: (count, self._worker_resident[key]) for key, count in self._worker_donors.items()}

    def snapshot(self) -> list[dict[str, object]]:
        """The catalog in a canonical order (for /debug/donors and replica comparisons)."""
        return [
            {
                "donor_id": entry.donor_id,
                "worker_id": entry.worker[0],
                "dp_rank": entry.worker[1],
                "namespace": entry.namespace,
                "blocks": len(entry.block_hashes),
                "resident": entry.missing == 0,
            }
            for entry in sorted(self._donors.values(), key=lambda e: e.donor_id)
        ]
