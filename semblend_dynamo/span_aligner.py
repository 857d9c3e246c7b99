"""Token-exact, position-independent spans between a target prompt and resident donors.

Donors are indexed per namespace by *chunks*: the hash of ``anchor_tokens`` tokens at every block-aligned
donor offset. :meth:`SpanAligner.align` hashes every target window at once (a polynomial rolling hash in
numpy), keeps the windows whose hash passes the namespace's chunk filter, looks those up all at once in a
bucketed numpy hash table (a chunk of one donor is then read vectorized, only a chunk several donors share needs a
Python loop over its postings), groups the hits by diagonal (donor, delta), and compares each diagonal token by token
in one vectorized pass to get maximal exact spans. Spans are trimmed inward to target block boundaries, filtered by
length and chosen greedily so they do not overlap on the target.

When its compiled core is loaded (:mod:`semblend_dynamo._native`, plain C through ctypes), :meth:`SpanAligner.align`
runs the same steps, the greedy choice included, in one C call (by default without the GIL), reading the tables, the
shared chunks' postings and a donor book (serial -> token address) as arrays; the numpy path is the reference
(identical spans) and the fallback.

A hash hit is never trusted: every span comes from a direct token comparison, so hash collisions cost
time, never correctness. Spans never cross namespaces: each namespace has its own chunk table.

Not thread-safe, except :meth:`SpanAligner.prepare_donor`: it reads nothing a mutation changes, so a donor's
array conversion and hashing run outside the owner's lock and only :meth:`SpanAligner.commit_donor` (the table
updates) needs it. The owner (:class:`~semblend_dynamo.pipeline.DonorDiscovery`) serializes everything else.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from semblend_dynamo import _native

__all__ = ["PreparedDonor", "Span", "SpanAligner"]

_BASE = 0x9E3779B97F4A7C15 | 1  # odd, so invertible modulo 2**64
_BASE_INV = pow(_BASE, -1, 1 << 64)
_MIX = np.uint64(0xD6E8FEB86659FD93)  # Fibonacci-style mixing of the hash before taking the top bits
_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_MIN_FILTER_BITS = 12
_FILTER_LOAD = 32  # filter slots per distinct chunk hash
# Each chunk hash sets two filter bits (a window passes when both are set: false-positive rate about 1/600 instead of
# 1/50 with one): the first at the top bits of the mixed hash, the second in the same 512-bit block (one cache line)
# at the next 9 bits, so the second test reads the line the first one fetched.
_BLOCK_BITS = 9
_IN_BLOCK = np.uint64((1 << _BLOCK_BITS) - 1)
_BLOCK = ~np.uint64((1 << _BLOCK_BITS) - 1)
_PROBE_MIX = np.uint64(0xBF58476D1CE4E5B9)  # the id table's slots: an unrelated odd constant, independent of the filter
_PROBE_MIX_INT = int(_PROBE_MIX)
_U64 = (1 << 64) - 1
_EMPTY = -1
_REMOVED = -2


@dataclass(frozen=True, slots=True)
class Span:
    """A token-exact match: ``target[target_start:target_end] == donor[donor_start:donor_end]``.

    A slotted dataclass (spans are made on every scheduler decision); offsets are ``>= 0``, the length ``> 0``.
    """

    donor_id: str
    donor_start: int
    target_start: int
    length: int

    def __post_init__(self) -> None:
        if self.donor_start < 0 or self.target_start < 0 or self.length <= 0:
            raise ValueError(f"span {self}: offsets must be >= 0 and the length > 0")

    @property
    def delta(self) -> int:
        """RoPE position delta: how far the donor's tokens move to reach their target positions."""
        return self.target_start - self.donor_start

    @property
    def target_end(self) -> int:
        return self.target_start + self.length

    @property
    def donor_end(self) -> int:
        return self.donor_start + self.length


@dataclass
class _Donor:
    donor_id: str
    serial: int
    namespace: str
    tokens: np.ndarray  # of the aligner's width (int64 or uint32), C-contiguous
    address: int  # of tokens, for the compiled core
    chunk_hashes: list[int]
    postings: list[int]
    slot: int = -1  # in the aligner's _DonorBook, while indexed by a native aligner


@dataclass(frozen=True, slots=True)
class PreparedDonor:
    """A donor hashed by :meth:`SpanAligner.prepare_donor`, to be indexed by :meth:`SpanAligner.commit_donor`."""

    donor: _Donor


@dataclass(frozen=True, slots=True)
class _Powers:
    """``B**i``, ``B**-i`` and ``B**-i * _MIX`` for ``i < size``; replaced whole when it grows, never changed."""

    pow: np.ndarray
    inv: np.ndarray
    inv_mix: np.ndarray

    @classmethod
    def of_size(cls, size: int) -> _Powers:
        inv = np.cumprod(np.full(size, _BASE_INV, dtype=np.uint64)) * np.uint64(_BASE)
        return cls(np.cumprod(np.full(size, _BASE, dtype=np.uint64)) * np.uint64(_BASE_INV), inv, inv * _MIX)


@dataclass
class _Candidate:
    serial: int
    start: int  # target side, block-aligned
    end: int
    delta: int


NATIVE_SPANS, NATIVE_SPANS_REASON = (
    _native.SPANS.use((Span, _native.TARGET_WORD))
    if _native.LIBRARY is not None
    else (None, "the native span aligner is not loaded")
)
"""The planner module's ``spans`` (:data:`semblend_dynamo._native.SPANS`): a native aligner calls the compiled
core through it and gets its rows as spans (None: through ctypes and :meth:`SpanAligner._spans_of`), and why."""

_START = operator.attrgetter("start")
_new = object.__new__
# Span's slots, set directly (a frozen dataclass's __init__ goes through object.__setattr__ and __post_init__).
_set_donor_id = Span.__dict__["donor_id"].__set__
_set_donor_start = Span.__dict__["donor_start"].__set__
_set_target_start = Span.__dict__["target_start"].__set__
_set_length = Span.__dict__["length"].__set__


class _IdTable:
    """Chunk hash -> key id in two numpy arrays of buckets (one cache line of hashes each), probed for many at once.

    It mirrors ``_ChunkTable.ids`` for the request path: the few hundred windows that pass the filter are looked up
    in one or two vectorized rounds whose memory reads overlap, where one dict probe each waits for its own cache
    misses. A hash lives in the first bucket from its own (linear probing over buckets) with a free entry; a removed
    one leaves a marker that later insertions reuse. The arrays are rebuilt, at half load or less, when used and
    marked entries reach three quarters of them.
    """

    def __init__(self) -> None:
        self._resize(8, np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64))

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """The key id of each hash, -1 where it is not in the table."""
        out = np.full(hashes.size, -1, dtype=np.int64)
        rows = np.arange(hashes.size)
        at = self._buckets(hashes)
        while True:
            ids, match = self._lookup(at, hashes)
            hit = match.ravel().nonzero()[0]  # entry i of bucket row r: r * 8 + i (a hash is in one entry at most)
            out[rows[hit >> 3]] = ids.ravel()[hit]
            further = self._further(ids, match)
            if not further.size:
                return out
            rows, hashes, at = rows[further], hashes[further], (at[further] + 1) & self._mask

    def insert(self, hashes: np.ndarray, ids: np.ndarray, live: int) -> None:
        """Add hashes not in the table; ``live``: how many the table then holds (to size a rebuild)."""
        if 4 * (self._used + hashes.size) > 3 * self.ids.size:
            held = self.ids >= 0
            self._resize(2 * live, np.concatenate((self.keys[held], hashes)), np.concatenate((self.ids[held], ids)))
            return
        self._place(hashes, ids)

    def insert_one(self, key: int, id_: int, live: int) -> None:
        """:meth:`insert` of one key not in the table, probed in Python (a few µs where the vectorized rounds take
        tens)."""
        if 4 * (self._used + 1) > 3 * self.ids.size:
            self.insert(np.array([key], dtype=np.uint64), np.array([id_], dtype=np.int64), live)
            return
        bucket = ((key * _PROBE_MIX_INT) & _U64) >> int(self._shift)
        while True:
            row = self.ids[bucket].tolist()
            for entry, held in enumerate(row):
                if held < 0:
                    self.keys[bucket, entry] = key
                    self.ids[bucket, entry] = id_
                    self._used += held == _EMPTY
                    return
            bucket = (bucket + 1) & self._mask

    def remove_one(self, key: int) -> None:
        """:meth:`remove` of one key, probed in Python."""
        bucket = ((key * _PROBE_MIX_INT) & _U64) >> int(self._shift)
        while True:
            ids = self.ids[bucket].tolist()
            keys = self.keys[bucket].tolist()
            for entry, held in enumerate(ids):
                if held >= 0 and keys[entry] == key:
                    self.ids[bucket, entry] = _REMOVED
                    return
            if _EMPTY in ids:
                return
            bucket = (bucket + 1) & self._mask

    def remove(self, hashes: np.ndarray) -> None:
        """Mark hashes in the table removed."""
        at = self._buckets(hashes)
        while True:
            ids, match = self._lookup(at, hashes)
            hit = match.ravel().nonzero()[0]
            self.ids[at[hit >> 3], hit & 7] = _REMOVED
            further = self._further(ids, match)
            if not further.size:
                return
            hashes, at = hashes[further], (at[further] + 1) & self._mask

    def _lookup(self, at: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of buckets ``at`` and where each bucket holds its hash (rows of 8 booleans)."""
        ids = self.ids.take(at, axis=0)
        match = self.keys.take(at, axis=0)
        match = match == hashes[:, None]
        match &= ids >= 0
        return ids, match

    @staticmethod
    def _further(ids: np.ndarray, match: np.ndarray) -> np.ndarray:
        """Rows whose hash was not found in a full bucket (no empty entry): it may sit in a later bucket."""
        empty = (ids == _EMPTY).view(np.uint64).ravel()  # a row of 8 booleans read as one integer: 0 when none
        found = match.view(np.uint64).ravel()
        return ((empty == 0) & (found == 0)).nonzero()[0]

    def _place(self, hashes: np.ndarray, ids: np.ndarray) -> None:
        at = self._buckets(hashes)
        while hashes.size:
            held = self.ids.take(at, axis=0)
            free = held < 0
            room = free.any(axis=1)
            entry = free.argmax(axis=1)
            claim_at, claim_entry = at[room], entry[room]
            self.ids[claim_at, claim_entry] = ids[room]  # several hashes may claim one entry: one of them gets it
            won = np.zeros(hashes.size, dtype=np.bool_)
            won[room] = self.ids[claim_at, claim_entry] == ids[room]
            self.keys[at[won], entry[won]] = hashes[won]
            self._used += int(np.count_nonzero(held[won, entry[won]] == _EMPTY))
            rest = ~won
            at[~room] += 1  # losers of a claim try their bucket again, hashes meeting a full one the next
            at &= self._mask
            hashes, ids, at = hashes[rest], ids[rest], at[rest]

    def _resize(self, entries: int, hashes: np.ndarray, ids: np.ndarray) -> None:
        bits = max(3, int(max(entries, 1) - 1).bit_length() - 3)  # buckets of 8
        self.keys = np.zeros((1 << bits, 8), dtype=np.uint64)
        self.ids = np.full((1 << bits, 8), _EMPTY, dtype=np.int32)
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        # Into empty buckets: each hash takes the entry of its rank among its bucket's hashes; the few a full bucket
        # turns away are placed by probing.
        at = self._buckets(hashes)
        order = np.argsort(at, kind="stable")
        at = at[order]
        starts = np.concatenate(([0], (at[1:] != at[:-1]).nonzero()[0] + 1))
        rank = np.arange(at.size) - np.repeat(starts, np.diff(np.append(starts, at.size)))
        fits = rank < 8
        self.keys[at[fits], rank[fits]] = hashes[order[fits]]
        self.ids[at[fits], rank[fits]] = ids[order[fits]]
        self._used = int(np.count_nonzero(fits))
        self._place(hashes[order[~fits]], ids[order[~fits]])

    def _buckets(self, hashes: np.ndarray) -> np.ndarray:
        out = hashes * _PROBE_MIX
        out >>= self._shift
        return out.view(np.intp)


class _ChunkTable:
    """One namespace's chunk hash -> postings, plus the arrays that read them vectorized.

    A posting packs ``serial << 32 | donor_offset``; lists keep insertion order, so the newest donor is last. Every
    chunk hash has a stable key id (``ids``, mirrored in ``id_table`` for the request path; freed ids are reused); for a hash with exactly one posting,
    ``single_serial[id]`` and ``single_offset[id]`` give it (serial -1: several postings, read ``postings``), so an
    admission or a release costs its own chunks, never the table's size. The filter is a bitset over slots
    (slot = top bits of the mixed hash): small enough to stay in cache on the hot path. ``_counts`` (distinct hashes
    per slot, uint16) is only touched on mutation, to know when a bit can be cleared; wrapping would take 65,536
    distinct hashes in one slot and could only hide matches, never invent them.

    ``mirror`` (a native aligner's table): the postings of every chunk several donors share are also kept in an int64
    array per key id (``_shared``, same order), whose address and length ``shared_at`` and ``shared_count`` give the
    compiled core: appended to on admission, shifted in place on release, dropped when one posting is left.
    """

    def __init__(self, mirror: bool = False) -> None:
        self.mirror = mirror
        self.postings: dict[int, list[int]] = {}
        self.ids: dict[int, int] = {}
        self.id_table = _IdTable()
        self.single_serial = np.full(64, -1, dtype=np.int64)
        self.single_offset = np.zeros(64, dtype=np.int64)
        self.shared_at = np.zeros(64, dtype=np.int64)
        self.shared_count = np.zeros(64, dtype=np.int64)
        self._shared: dict[int, np.ndarray] = {}
        self._free: list[int] = []
        self._next_id = 0
        self._counts = np.zeros(1 << _MIN_FILTER_BITS, dtype=np.uint16)
        self._bits = np.zeros((1 << _MIN_FILTER_BITS) // 8, dtype=np.uint8)
        self._shift = np.uint64(64 - _MIN_FILTER_BITS)
        self._view: _native.TableView | None = None
        self._changed = True  # since the view was last checked: add and remove may replace arrays

    def native_view(self) -> _native.TableView:
        """The arrays' addresses for the compiled core; made again when an array was replaced (checked only after a
        change: an alignment between changes reads the view as it is)."""
        if not self._changed and self._view is not None:
            return self._view
        self._changed = False
        ids = self.id_table
        self._view = _native.current_view(
            self._view,
            _native.TableView,
            self._bits,
            int(self._shift),
            ids.keys,
            ids.ids,
            int(ids._shift),
            ids._mask,
            self.single_serial,
            self.single_offset,
            self.shared_at,
            self.shared_count,
        )
        return self._view

    def slots(self, hashes: np.ndarray) -> np.ndarray:
        """The two filter slots of each hash: the first ones, then the second ones (a hash's two may coincide)."""
        return self._both(hashes * _MIX).view(np.intp)  # < 2**bits: the same values

    def _both(self, mixed: np.ndarray) -> np.ndarray:
        """The first slots (``mixed``'s top bits) and the second ones (the same 512-bit block, at the next 9 bits)."""
        first = mixed >> self._shift
        second = mixed >> (self._shift - np.uint64(_BLOCK_BITS))
        second &= _IN_BLOCK
        second |= first & _BLOCK
        return np.concatenate((first, second))

    def screen(self, sums: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """Indices of the windows that may be in the table (no false negatives).

        ``sums * scale`` is each window's hash times the mixing constant (``scale``: ``B**-i * _MIX``), so the
        hashes themselves are only computed for the windows that pass.
        """
        at = self._both(sums * scale).view(np.intp)
        bit = at.astype(np.uint8)  # the low byte holds the bit's index in its byte
        bit &= 7
        at >>= 3
        bits = self._bits.take(at)
        bits >>= bit
        bits &= 1
        passed = bits[: sums.size]
        passed &= bits[sums.size :]  # both of a window's bits set
        return passed.view(np.bool_).nonzero()[0]  # 0/1 bytes: a bool view takes nonzero's fast path (1/7 the time)

    def add(self, hashes: list[int], postings: list[int]) -> None:
        self._changed = True
        new: list[int] = []
        new_postings: list[int] = []
        shared: list[int] = []
        for h, p in zip(hashes, postings, strict=True):
            plist = self.postings.get(h)
            if plist is None:
                self.postings[h] = [p]
                new.append(h)
                new_postings.append(p)
            else:
                plist.append(p)
                shared.append(h)
        if new:
            ids = self._take_ids(len(new))
            self.ids.update(zip(new, ids, strict=True))
            self.id_table.insert(np.array(new, dtype=np.uint64), np.array(ids, dtype=np.int64), len(self.postings))
            packed = np.array(new_postings, dtype=np.int64)
            self.single_serial[ids] = packed >> _OFFSET_BITS
            self.single_offset[ids] = packed & _OFFSET_MASK
        if shared:
            self.single_serial[[self.ids[h] for h in shared]] = -1
            if self.mirror:
                for h in dict.fromkeys(shared):
                    self._mirror_appended(h)
        if not new:
            return
        if len(self.postings) * _FILTER_LOAD > self._counts.size:
            self._rebuild()
            return
        slots = self.slots(np.array(new, dtype=np.uint64))
        np.add.at(self._counts, slots, 1)
        np.bitwise_or.at(self._bits, slots >> 3, (1 << (slots & 7)).astype(np.uint8))

    def remove(self, hashes: list[int], postings: list[int]) -> None:
        self._changed = True
        gone: list[int] = []
        touched: list[int] = []
        for h, p in zip(hashes, postings, strict=True):
            plist = self.postings.get(h)
            if plist is None:
                continue
            try:
                at = plist.index(p)
            except ValueError:
                continue
            del plist[at]
            if self.mirror and len(plist) >= 1:
                self._mirror_removed(self.ids[h], at)
            if not plist:
                del self.postings[h]
                key = self.ids.pop(h)
                self._free.append(key)
                self._mirror_dropped(key)
                gone.append(h)
            else:
                touched.append(h)
        alone = [h for h in dict.fromkeys(touched) if len(self.postings.get(h, ())) == 1]
        if alone:  # back to one posting: readable vectorized again
            packed = np.array([self.postings[h][0] for h in alone], dtype=np.int64)
            ids = [self.ids[h] for h in alone]
            self.single_serial[ids] = packed >> _OFFSET_BITS
            self.single_offset[ids] = packed & _OFFSET_MASK
            for key in ids:
                self._mirror_dropped(key)
        if not gone:
            return
        removed = np.array(gone, dtype=np.uint64)
        self.id_table.remove(removed)
        slots = self.slots(removed)
        np.subtract.at(self._counts, slots, 1)
        empty = slots[self._counts[slots] == 0]
        np.bitwise_and.at(self._bits, empty >> 3, (~(1 << (empty & 7))).astype(np.uint8))

    def _mirror_appended(self, h: int) -> None:
        """The postings of ``h`` (two or more) appended since its mirror was last written, copied to it."""
        plist = self.postings[h]
        key = self.ids[h]
        arr = self._shared.get(key)
        have = 0 if arr is None else int(self.shared_count[key])
        if arr is None or arr.size < len(plist):
            grown = np.empty(max(4, 2 * len(plist)), dtype=np.int64)
            if arr is not None:
                grown[:have] = arr[:have]
            arr = self._shared[key] = grown
            self.shared_at[key] = arr.__array_interface__["data"][0]
        arr[have : len(plist)] = plist[have:]
        self.shared_count[key] = len(plist)

    def _mirror_removed(self, key: int, at: int) -> None:
        """Posting ``at`` of a shared chunk's list was deleted: the same in its mirror (when it has one)."""
        arr = self._shared.get(key)
        if arr is None:
            return
        count = int(self.shared_count[key])
        arr[at : count - 1] = arr[at + 1 : count]  # numpy copies overlapping ranges as if through a buffer
        self.shared_count[key] = count - 1

    def _mirror_dropped(self, key: int) -> None:
        if self._shared.pop(key, None) is not None:
            self.shared_at[key] = 0
            self.shared_count[key] = 0

    def _take_ids(self, n: int) -> list[int]:
        """``n`` key ids: freed ones first, then never-used ones (the arrays double when full)."""
        reused = [self._free.pop() for _ in range(min(n, len(self._free)))]
        fresh = list(range(self._next_id, self._next_id + n - len(reused)))
        self._next_id += len(fresh)
        if self._next_id > self.single_serial.size:
            grow = max(self._next_id, 2 * self.single_serial.size) - self.single_serial.size
            self.single_serial = np.concatenate((self.single_serial, np.full(grow, -1, dtype=np.int64)))
            self.single_offset = np.concatenate((self.single_offset, np.zeros(grow, dtype=np.int64)))
            self.shared_at = np.concatenate((self.shared_at, np.zeros(grow, dtype=np.int64)))
            self.shared_count = np.concatenate((self.shared_count, np.zeros(grow, dtype=np.int64)))
        return reused + fresh

    def _rebuild(self) -> None:
        bits = max(_MIN_FILTER_BITS, int(len(self.postings) * _FILTER_LOAD - 1).bit_length())
        self._shift = np.uint64(64 - bits)
        keys = np.fromiter(self.postings.keys(), dtype=np.uint64, count=len(self.postings))
        self._counts = np.bincount(self.slots(keys), minlength=1 << bits).astype(np.uint16)
        self._bits = np.packbits(self._counts > 0, bitorder="little")


class _DonorBook:
    """A native aligner's donors for the compiled core: serial -> slot in an :class:`_IdTable` (the chunk tables' kind,
    keyed by serial), and each slot's token address, length and donor id. Slots of released donors are reused."""

    def __init__(self) -> None:
        self.slots = _IdTable()
        self.address = np.zeros(64, dtype=np.int64)
        self.length = np.zeros(64, dtype=np.int64)
        self.donor_ids: list[str | None] = []  # per slot
        self._free: list[int] = []
        self._next = 0
        self._view: _native.DonorsView | None = None
        self._changed = True  # as _ChunkTable's

    def add(self, donor: _Donor) -> None:
        self._changed = True
        if self._free:
            slot = self._free.pop()
        else:
            slot = self._next
            self._next += 1
            self.donor_ids.append(None)
            if slot == self.address.size:
                self.address = np.concatenate((self.address, np.zeros(slot, dtype=np.int64)))
                self.length = np.concatenate((self.length, np.zeros(slot, dtype=np.int64)))
        self.address[slot] = donor.address
        self.length[slot] = donor.tokens.size
        self.donor_ids[slot] = donor.donor_id
        live = self._next - len(self._free)
        self.slots.insert_one(donor.serial, slot, live)
        donor.slot = slot

    def remove(self, donor: _Donor) -> None:
        self._changed = True
        self.slots.remove_one(donor.serial)
        self.donor_ids[donor.slot] = None
        self._free.append(donor.slot)

    def native_view(self) -> _native.DonorsView:
        if not self._changed and self._view is not None:
            return self._view
        self._changed = False
        slots = self.slots
        self._view = _native.current_view(
            self._view,
            _native.DonorsView,
            slots.keys,
            slots.ids,
            int(slots._shift),
            slots._mask,
            self.address,
            self.length,
        )
        return self._view


class SpanAligner:
    """Finds maximal token-exact spans between a target and the donors of one namespace.

    ``block_size`` is the KV block size: donor chunks sit at block-aligned donor offsets and returned spans
    are block-aligned on the target side (donor offsets may be anything). ``min_span_tokens`` is the
    shortest span returned (after trimming). ``anchor_tokens`` (default: ``block_size``) is the hashed
    chunk length; any exact match of at least ``block_size + anchor_tokens - 1`` tokens is found.
    ``max_postings`` bounds how many donors (newest first) are considered per chunk, so a chunk shared by
    thousands of donors (a common system prompt) costs a bounded amount; ``max_diagonals`` bounds how many
    (donor, delta) diagonals are compared, the ones with most anchor hits first. ``native``: align with the compiled
    core (``semblend_dynamo._native``; ValueError when it is not loaded), with numpy (False), or with the compiled
    core when it is loaded (None); both give the same spans. ``tokens_u32``: keep donors and targets as uint32 (the
    connector's prompts and donor copies: half the bytes an alignment reads, no int64 copy of the prompt) instead of
    int64; the spans are the same.
    """

    def __init__(
        self,
        block_size: int,
        min_span_tokens: int,
        anchor_tokens: int | None = None,
        *,
        max_postings: int = 4,
        max_diagonals: int = 64,
        native: bool | None = None,
        tokens_u32: bool = False,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if min_span_tokens < 1:
            raise ValueError(f"min_span_tokens must be >= 1, got {min_span_tokens}")
        anchor = block_size if anchor_tokens is None else anchor_tokens
        if anchor < 1:
            raise ValueError(f"anchor_tokens must be >= 1, got {anchor_tokens}")
        if max_postings < 1 or max_diagonals < 1:
            raise ValueError("max_postings and max_diagonals must be >= 1")
        if native and _native.LIBRARY is None:
            raise ValueError(f"the native span aligner is not available: {_native.REASON}")
        self.block_size = block_size
        self.min_span_tokens = min_span_tokens
        self.anchor_tokens = anchor
        self.max_postings = max_postings
        self.max_diagonals = max_diagonals
        self.native = _native.LIBRARY is not None if native is None else native
        self.dtype = np.dtype(np.uint32 if tokens_u32 else np.int64)
        self._work = np.zeros(0, dtype=np.int64)  # the compiled core's work buffer, kept between alignments
        self._work_for = (0, 0)  # (target length, max_spans) the buffer is known to be large enough for
        self._params = (anchor, block_size, min_span_tokens, max_diagonals, max_postings)
        self._book = _DonorBook() if self.native else None
        self._call = _native.AlignCall(self._params) if self.native else None
        self._donors: dict[str, _Donor] = {}
        self._by_serial: dict[int, _Donor] = {}
        self._tables: dict[str, _ChunkTable] = {}
        self._serials = itertools.count()  # next() is atomic: prepare_donor takes serials without the lock
        self._powers = _Powers.of_size(1)
        self.spans_in_c = NATIVE_SPANS is not None and self.native
        """A native aligner's call and its spans through the planner module (:data:`NATIVE_SPANS`); False: ctypes and
        a Python loop over the rows (the same spans)."""
        self.hold_gil: Callable[[], bool] | None = None
        """Asked before each compiled search: True keeps the GIL for it where the library lets it go. The router's:
        while a background thread runs a step, which would take the GIL during the search and keep the loop waiting
        for it afterwards (up to the switch interval)."""

    # --- donors -----------------------------------------------------------------------------------
    def add_donor(self, donor_id: str, namespace: str, tokens: Sequence[int]) -> None:
        """Index a donor's tokens under ``namespace``; a donor id already present is replaced.

        Raises ValueError for token ids outside ``[0, 2**31)`` (they cannot come from a tokenizer).
        """
        self.commit_donor(self.prepare_donor(donor_id, namespace, tokens))

    def prepare_donor(self, donor_id: str, namespace: str, tokens: Sequence[int]) -> PreparedDonor:
        """:meth:`add_donor`'s validation, array conversion and hashing; safe to call concurrently with anything.

        Raises ValueError for token ids outside ``[0, 2**31)``.
        """
        # A read-only array of our width that owns its memory (the donor registry's) cannot change under us: shared,
        # so the connector's later re-check reads the same (cached) tokens the aligner compared.
        arr: np.ndarray = (
            tokens
            if isinstance(tokens, np.ndarray)
            and tokens.dtype == self.dtype
            and not tokens.flags.writeable
            and tokens.base is None
            and tokens.flags.c_contiguous
            else np.array(tokens, dtype=np.int64)
        )
        if arr.ndim != 1:
            raise ValueError("donor tokens must be a flat sequence of token ids")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 1 << 31):
            raise ValueError(f"donor {donor_id!r}: token ids must be in [0, 2**31)")
        if arr.dtype != self.dtype:
            arr = arr.astype(self.dtype)
        serial = next(self._serials)
        hashes: list[int] = []
        postings: list[int] = []
        if arr.size >= self.anchor_tokens:
            window = self._window_hashes(arr)
            starts = np.arange(0, window.size, self.block_size)
            hashes = window[starts].tolist()
            postings = (starts | serial << _OFFSET_BITS).tolist()
        address = arr.__array_interface__["data"][0]
        return PreparedDonor(_Donor(donor_id, serial, namespace, arr, address, hashes, postings))

    def commit_donor(self, prepared: PreparedDonor) -> None:
        """Index a prepared donor (replacing one with the same id): the table updates, a few per chunk."""
        donor = prepared.donor
        self.remove_donor(donor.donor_id)
        self._donors[donor.donor_id] = donor
        self._by_serial[donor.serial] = donor
        if self._book is not None:
            self._book.add(donor)
        if donor.chunk_hashes:
            table = self._tables.get(donor.namespace)
            if table is None:  # made only when needed: building one costs ~0.1 ms, under the lock discover() reads with
                table = self._tables[donor.namespace] = _ChunkTable(mirror=self.native)
            table.add(donor.chunk_hashes, donor.postings)
        self._refresh_views(donor.namespace)

    def remove_donor(self, donor_id: str) -> bool:
        """Forget a donor (evicted, released). Returns False if it was not indexed."""
        donor = self._donors.pop(donor_id, None)
        if donor is None:
            return False
        del self._by_serial[donor.serial]
        if self._book is not None:
            self._book.remove(donor)
        table = self._tables.get(donor.namespace)
        if table is not None and donor.chunk_hashes:
            table.remove(donor.chunk_hashes, donor.postings)
            if not table.postings:
                del self._tables[donor.namespace]
        self._refresh_views(donor.namespace)
        return True

    def _refresh_views(self, namespace: str) -> None:
        """A native aligner's views checked after a change, so the next alignment (a request's) need not."""
        if self._book is None:
            return
        self._book.native_view()
        table = self._tables.get(namespace)
        if table is not None:
            table.native_view()

    def __contains__(self, donor_id: object) -> bool:
        return donor_id in self._donors

    def __len__(self) -> int:
        return len(self._donors)

    def donor_tokens(self, donor_id: str) -> Sequence[int] | None:
        """The donor's tokens (read-only numpy array of the aligner's width), or None if unknown."""
        donor = self._donors.get(donor_id)
        if donor is None:
            return None
        view = donor.tokens.view()
        view.flags.writeable = False
        return view  # type: ignore[return-value]

    def donor_namespace(self, donor_id: str) -> str | None:
        donor = self._donors.get(donor_id)
        return None if donor is None else donor.namespace

    # --- alignment --------------------------------------------------------------------------------
    def align(
        self,
        namespace: str,
        target: Sequence[int] | np.ndarray,
        *,
        candidates: Collection[str] | None = None,
        max_spans: int = 8,
    ) -> list[Span]:
        """Up to ``max_spans`` non-overlapping spans on the target, sorted by ``target_start``.

        Only donors of ``namespace`` (and, if given, in ``candidates``) are considered. Spans are
        block-aligned on the target side and at least ``min_span_tokens`` long. Called on the request path: pass a
        numpy array of the aligner's width (``dtype``) to skip the conversion (a uint32 aligner refuses token ids
        outside ``[0, 2**32)``: OverflowError).
        """
        table = self._tables.get(namespace)
        if table is None or max_spans < 1:
            return []
        t = np.ascontiguousarray(target, dtype=self.dtype)
        if t.ndim != 1 or t.size < max(self.anchor_tokens, self.min_span_tokens):
            return []
        allowed = self._allowed_serials(namespace, candidates)
        if allowed is not None and not allowed:
            return []
        if self.native:
            return self._native_align(table, t, allowed, max_spans)
        return [
            Span(self._by_serial[c.serial].donor_id, c.start - c.delta, c.start, c.end - c.start)
            for c in self._choose(self._candidates(table, t, allowed), max_spans)
        ]

    def _allowed_serials(self, namespace: str, candidates: Collection[str] | None) -> set[int] | None:
        if candidates is None:
            return None
        out: set[int] = set()
        for donor_id in candidates:
            donor = self._donors.get(donor_id)
            if donor is not None and donor.namespace == namespace:
                out.add(donor.serial)
        return out

    def _candidates(self, table: _ChunkTable, t: np.ndarray, allowed: set[int] | None) -> list[_Candidate]:
        """The numpy path: the exact runs on the best-ranked diagonals, trimmed to target blocks."""
        diagonals = self._diagonals(table, t, allowed)
        if not diagonals:
            return []
        ranked = sorted(diagonals.items(), key=lambda kv: (-kv[1][0], -kv[0][0], kv[0][1]))
        windows: list[tuple[int, int, int, int]] = []
        seen: set[tuple[int, int, int, int]] = set()
        for (serial, delta), (hits, first, last) in ranked:
            # Donors sharing the same hits at the same delta (common boilerplate) give the same spans: the
            # newest one stands for them.
            signature = (delta, first, last, hits)
            if signature in seen:
                continue
            seen.add(signature)
            window = self._window(t, serial, delta, first, last)
            if window is not None:
                windows.append((serial, delta, *window))
            if len(seen) == self.max_diagonals:
                break
        return self._runs(t, windows)

    def _native_align(self, table: _ChunkTable, t: np.ndarray, allowed: set[int] | None, max_spans: int) -> list[Span]:
        """:meth:`align` in the compiled core, one call from the window scan to the greedy cover (the numpy path's steps,
        the postings of shared chunks included)."""
        assert self._book is not None and self._call is not None
        if self._work_for != (t.size, max_spans):
            size = _native.work_size(t.size, self.anchor_tokens, self.min_span_tokens, *self._params[3:], max_spans)
            if self._work.size < size:
                self._work = np.empty(size, dtype=np.int64)
                self._call.set_work(self._work)
            self._work_for = (t.size, max_spans)
        # alignments never overlap (see the class): each reuses the work buffer
        if self.spans_in_c:
            return self._call.spans(
                NATIVE_SPANS,  # type: ignore[arg-type]  # spans_in_c: loaded
                table.native_view(),
                self._book.native_view(),
                t,
                max_spans,
                None if allowed is None else np.array(sorted(allowed), dtype=np.int64),
                self._book.donor_ids,
                hold_gil=self.hold_gil is not None and self.hold_gil(),
            )
        found = self._call.run(
            table.native_view(),
            self._book.native_view(),
            t,
            max_spans,
            None if allowed is None else np.array(sorted(allowed), dtype=np.int64),
            hold_gil=self.hold_gil is not None and self.hold_gil(),
        )
        if not found:
            return []
        return self._spans_of(self._work[: 4 * found].tolist())

    def _spans_of(self, rows: list[int]) -> list[Span]:
        """Spans of the compiled core's rows, flat (donor slot, donor start, target start, length, ...)."""
        assert self._book is not None
        names = self._book.donor_ids
        out = []
        row = iter(rows)
        for slot, start, at, length in zip(row, row, row, row, strict=True):
            # Span(...) without its checks, which the core's rows pass: 1/3 the time
            span = _new(Span)
            _set_donor_id(span, names[slot])
            _set_donor_start(span, start)
            _set_target_start(span, at)
            _set_length(span, length)
            out.append(span)
        return out

    def _shared_hits(
        self, table: _ChunkTable, positions: list[int], hashes: list[int], allowed: set[int] | None
    ) -> list[tuple[int, int, int]]:
        """Hits (serial, delta, position) on chunks several donors share: the newest ``max_postings`` allowed
        postings of each."""
        out: list[tuple[int, int, int]] = []
        postings = table.postings
        cap = self.max_postings
        for p, h in zip(positions, hashes, strict=True):
            taken = 0
            for packed in reversed(postings[h]):
                serial = packed >> _OFFSET_BITS
                if allowed is not None and serial not in allowed:
                    continue
                out.append((serial, p - (packed & _OFFSET_MASK), p))
                taken += 1
                if taken == cap:
                    break
        return out

    def _diagonals(
        self, table: _ChunkTable, t: np.ndarray, allowed: set[int] | None
    ) -> dict[tuple[int, int], list[int]]:
        """Per (serial, delta) diagonal: [anchor hits, first hit position, last hit position]."""
        sums, powers = self._window_sums(t)
        positions = table.screen(sums, powers.inv_mix[: sums.size])
        if not positions.size:
            return {}
        wanted = sums[positions]  # hashed only where the filter lets a window through
        wanted *= powers.inv[positions]
        found = table.id_table.find(wanted)
        hit = found >= 0
        positions, at = positions[hit], found[hit]
        serials = table.single_serial[at]
        one = serials >= 0
        shared = not one.all()
        pos = positions
        if shared:
            at, pos, serials = at[one], positions[one], serials[one]
        # Chunks of one donor (nearly all of them): one posting each, grouped by diagonal vectorized.
        deltas = pos - table.single_offset[at]
        if allowed is not None:  # a hint names one donor: then one comparison instead of np.isin's machinery
            keep = serials == next(iter(allowed)) if len(allowed) == 1 else np.isin(serials, list(allowed))
            pos, serials, deltas = pos[keep], serials[keep], deltas[keep]
        diagonals: dict[tuple[int, int], list[int]] = {}
        if pos.size:
            # Anchors in target order, cut where the diagonal changes: one group per stretch of a diagonal (one in
            # all for a plain hit); a diagonal met again after another adds to its entry.
            cuts = ((serials[1:] != serials[:-1]) | (deltas[1:] != deltas[:-1])).nonzero()[0] + 1
            starts = [0, *cuts.tolist()]
            stops = [*starts[1:], pos.size]
            for first, stop, serial, delta, lo, hi in zip(
                starts,
                stops,
                serials[starts].tolist(),
                deltas[starts].tolist(),
                pos[starts].tolist(),
                pos[np.array(stops) - 1].tolist(),
                strict=True,
            ):
                entry = diagonals.get((serial, delta))
                if entry is None:
                    diagonals[(serial, delta)] = [stop - first, lo, hi]
                else:
                    entry[0] += stop - first
                    entry[2] = hi
        if not shared:
            return diagonals
        # Chunks several donors share: their postings, newest first, at most max_postings per anchor.
        many = ~one
        for serial, delta, p in self._shared_hits(table, positions[many].tolist(), wanted[hit][many].tolist(), allowed):
            entry = diagonals.get((serial, delta))
            if entry is None:
                diagonals[(serial, delta)] = [1, p, p]
            else:  # an anchor adds at most one hit to a diagonal, so merging is count, min, max
                entry[0] += 1
                entry[1] = min(entry[1], p)
                entry[2] = max(entry[2], p)
        return diagonals

    def _window(self, t: np.ndarray, serial: int, delta: int, first: int, last: int) -> tuple[int, int] | None:
        """The target range to compare on one diagonal whose anchor hits lie at target positions [first, last].

        It starts one chunk beyond the hits and gallops outward while its edge token still matches, so every exact
        run inside it is maximal. None when it cannot hold a span of min_span_tokens.
        """
        d = self._by_serial[serial].tokens
        diag_lo = max(0, delta)
        diag_hi = min(t.size, d.size + delta)
        reach = self.block_size + self.anchor_tokens
        lo = max(diag_lo, first - reach)
        hi = min(diag_hi, last + self.anchor_tokens + reach)
        while lo > diag_lo and t[lo] == d[lo - delta]:
            lo = max(diag_lo, lo - 2 * (hi - lo))
        while hi < diag_hi and t[hi - 1] == d[hi - 1 - delta]:
            hi = min(diag_hi, hi + 2 * (hi - lo))
        return (lo, hi) if hi - lo >= self.min_span_tokens else None

    def _runs(self, t: np.ndarray, windows: list[tuple[int, int, int, int]]) -> list[_Candidate]:
        """Exact runs of every (serial, delta, lo, hi) window, trimmed to target blocks, >= min_span_tokens.

        All windows are compared into one buffer, each preceded by a mismatch, so run detection is one vectorized
        pass: runs are the gaps between mismatches. Only runs long enough before trimming (a few) are trimmed.
        """
        if not windows:
            return []
        differ = np.ones(sum(hi - lo + 1 for _, _, lo, hi in windows) + 1, dtype=np.bool_)
        ends: list[int] = []  # buffer index where each window's comparison ends
        at = 1
        for serial, delta, lo, hi in windows:
            d = self._by_serial[serial].tokens
            np.not_equal(t[lo:hi], d[lo - delta : hi - delta], out=differ[at : at + hi - lo])
            at += hi - lo
            ends.append(at)
            at += 1
        stops = differ.nonzero()[0]  # on 1-D arrays: flatnonzero and diff without their Python wrappers
        long_enough = (stops[1:] - stops[:-1] > self.min_span_tokens).nonzero()[0]
        bs = self.block_size
        out = []
        for start, end in zip((stops[long_enough] + 1).tolist(), stops[long_enough + 1].tolist(), strict=True):
            w = bisect.bisect_left(ends, end)
            serial, delta, lo, hi = windows[w]
            offset = ends[w] - hi  # buffer index - offset = target position
            first = -(-(start - offset) // bs) * bs
            last = (end - offset) // bs * bs
            if last - first >= self.min_span_tokens:
                out.append(_Candidate(serial, first, last, delta))
        return out

    def _choose(self, found: list[_Candidate], max_spans: int) -> list[_Candidate]:
        """Greedy cover: longest first, then a donor already used, then delta 0, then newest donor."""
        if len(found) <= max_spans:
            by_start = sorted(found, key=_START)
            if all(a.end <= b.start for a, b in itertools.pairwise(by_start)):
                return by_start  # nothing overlaps (the usual case): the greedy cover would take every one, unclipped
        chosen: list[_Candidate] = []
        used: set[int] = set()
        remaining = found
        while remaining and len(chosen) < max_spans:
            best = min(
                remaining,
                key=lambda c: (c.start - c.end, c.serial not in used, c.delta != 0, abs(c.delta), c.start, -c.serial),
            )
            chosen.append(best)
            used.add(best.serial)
            clipped: list[_Candidate] = []
            for c in remaining:
                if c is best:
                    continue
                if c.end <= best.start or c.start >= best.end:
                    clipped.append(c)
                    continue
                for s, e in ((c.start, best.start), (best.end, c.end)):
                    if e - s >= self.min_span_tokens:
                        clipped.append(_Candidate(c.serial, s, e, c.delta))
            remaining = clipped
        chosen.sort(key=lambda c: c.start)
        return chosen

    # --- hashing ----------------------------------------------------------------------------------
    def _window_hashes(self, tokens: np.ndarray) -> np.ndarray:
        """Polynomial hash (mod 2**64) of every ``anchor_tokens`` window; entry i is the window at i."""
        sums, powers = self._window_sums(tokens)
        return sums * powers.inv[: sums.size]

    def _window_sums(self, tokens: np.ndarray) -> tuple[np.ndarray, _Powers]:
        """Entry i: the sum of ``tokens[i + j] * B**(i + j)`` over the window at i (its hash times ``B**i``), and
        the power tables used (long enough for ``tokens``).

        Window sums of width 2w are two sums of width w (one add each, no serial prefix sum); the anchor width is
        made of its binary digits.
        """
        n = tokens.size
        a = self.anchor_tokens
        powers = self._powers_for(n)
        sums = (tokens.view(np.uint64) if tokens.dtype == np.int64 else tokens) * powers.pow[:n]  # uint64 products
        out: np.ndarray | None = None
        at, width = 0, 1
        while True:
            if a & width:
                part = sums[at : at + n - a + 1]
                out = part if out is None else out + part
                at += width
            if 2 * width > a:
                return out, powers  # type: ignore[return-value]  # a >= 1 has a highest binary digit
            sums = sums[:-width] + sums[width:]
            width *= 2

    def _powers_for(self, n: int) -> _Powers:
        """Power tables of at least ``n`` entries. Callers keep the one returned: a concurrent prepare may replace
        ``self._powers`` (with tables that are also long enough for what it needs)."""
        powers = self._powers
        if powers.pow.size >= n:
            return powers
        powers = _Powers.of_size(max(n, 2 * powers.pow.size))
        self._powers = powers
        return powers
