"""The span aligner as it was before its vectorized lookups (issue 16.2): the oracle its replacement must equal.

Verbatim but for the name and the return type (``(donor_id, donor_start, target_start, length)`` tuples instead of
``Span``): a cumulative-sum rolling hash, a bitset filter and a Python loop over the postings of every anchor that
passes it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

_BASE = 0x9E3779B97F4A7C15 | 1  # odd, so invertible modulo 2**64
_BASE_INV = pow(_BASE, -1, 1 << 64)
_MIX = np.uint64(0xD6E8FEB86659FD93)  # Fibonacci-style mixing of the hash before taking the top bits
_OFFSET_BITS = 32
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
_MIN_FILTER_BITS = 12
_FILTER_LOAD = 32  # filter slots per distinct chunk hash (false-positive rate about 1/32)


@dataclass
class _Donor:
    donor_id: str
    serial: int
    namespace: str
    tokens: np.ndarray  # int64
    chunk_hashes: list[int]
    chunk_offsets: list[int]


@dataclass
class _Candidate:
    serial: int
    start: int  # target side, block-aligned
    end: int
    delta: int


class _ChunkTable:
    """One namespace's chunk hash -> postings, plus a filter that screens target windows vectorized.

    A posting packs ``serial << 32 | donor_offset``; lists keep insertion order, so the newest donor is last.
    The filter is a bitset over slots (slot = top bits of the mixed hash): small enough to stay in cache on the
    hot path. ``_counts`` (distinct hashes per slot, uint16) is only touched on mutation, to know when a bit can
    be cleared; wrapping would take 65,536 distinct hashes in one slot and could only hide matches, never
    invent them.
    """

    def __init__(self) -> None:
        self.postings: dict[int, list[int]] = {}
        self._counts = np.zeros(1 << _MIN_FILTER_BITS, dtype=np.uint16)
        self._bits = np.zeros((1 << _MIN_FILTER_BITS) // 8, dtype=np.uint8)
        self._shift = np.uint64(64 - _MIN_FILTER_BITS)

    def slots(self, hashes: np.ndarray) -> np.ndarray:
        return ((hashes * _MIX) >> self._shift).astype(np.intp)

    def screen(self, hashes: np.ndarray) -> np.ndarray:
        """Indices of the hashes that may be in the table (no false negatives)."""
        slots = self.slots(hashes)
        return np.flatnonzero((self._bits[slots >> 3] >> (slots & 7).astype(np.uint8)) & 1)

    def add(self, hashes: list[int], postings: list[int]) -> None:
        new: list[int] = []
        for h, p in zip(hashes, postings, strict=True):
            plist = self.postings.get(h)
            if plist is None:
                self.postings[h] = [p]
                new.append(h)
            else:
                plist.append(p)
        if not new:
            return
        if len(self.postings) * _FILTER_LOAD > self._counts.size:
            self._rebuild()
            return
        slots = self.slots(np.array(new, dtype=np.uint64))
        np.add.at(self._counts, slots, 1)
        np.bitwise_or.at(self._bits, slots >> 3, (1 << (slots & 7)).astype(np.uint8))

    def remove(self, hashes: list[int], postings: list[int]) -> None:
        gone: list[int] = []
        for h, p in zip(hashes, postings, strict=True):
            plist = self.postings.get(h)
            if plist is None:
                continue
            try:
                plist.remove(p)
            except ValueError:
                continue
            if not plist:
                del self.postings[h]
                gone.append(h)
        if not gone:
            return
        slots = self.slots(np.array(gone, dtype=np.uint64))
        np.subtract.at(self._counts, slots, 1)
        empty = slots[self._counts[slots] == 0]
        np.bitwise_and.at(self._bits, empty >> 3, (~(1 << (empty & 7))).astype(np.uint8))

    def _rebuild(self) -> None:
        bits = max(_MIN_FILTER_BITS, int(len(self.postings) * _FILTER_LOAD - 1).bit_length())
        self._shift = np.uint64(64 - bits)
        keys = np.fromiter(self.postings.keys(), dtype=np.uint64, count=len(self.postings))
        self._counts = np.bincount(self.slots(keys), minlength=1 << bits).astype(np.uint16)
        self._bits = np.packbits(self._counts > 0, bitorder="little")


class ReferenceSpanAligner:
    """Finds maximal token-exact spans between a target and the donors of one namespace.

    ``block_size`` is the KV block size: donor chunks sit at block-aligned donor offsets and returned spans
    are block-aligned on the target side (donor offsets may be anything). ``min_span_tokens`` is the
    shortest span returned (after trimming). ``anchor_tokens`` (default: ``block_size``) is the hashed
    chunk length; any exact match of at least ``block_size + anchor_tokens - 1`` tokens is found.
    ``max_postings`` bounds how many donors (newest first) are considered per chunk, so a chunk shared by
    thousands of donors (a common system prompt) costs a bounded amount; ``max_diagonals`` bounds how many
    (donor, delta) diagonals are compared, the ones with most anchor hits first.
    """

    def __init__(
        self,
        block_size: int,
        min_span_tokens: int,
        anchor_tokens: int | None = None,
        *,
        max_postings: int = 4,
        max_diagonals: int = 64,
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
        self.block_size = block_size
        self.min_span_tokens = min_span_tokens
        self.anchor_tokens = anchor
        self.max_postings = max_postings
        self.max_diagonals = max_diagonals
        self._donors: dict[str, _Donor] = {}
        self._by_serial: dict[int, _Donor] = {}
        self._tables: dict[str, _ChunkTable] = {}
        self._next_serial = 0
        self._pow: np.ndarray = np.ones(1, dtype=np.uint64)
        self._inv_pow: np.ndarray = np.ones(1, dtype=np.uint64)

    # --- donors -----------------------------------------------------------------------------------
    def add_donor(self, donor_id: str, namespace: str, tokens: Sequence[int]) -> None:
        """Index a donor's tokens under ``namespace``; a donor id already present is replaced.

        Raises ValueError for token ids outside ``[0, 2**31)`` (they cannot come from a tokenizer).
        """
        arr = np.array(tokens, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError("donor tokens must be a flat sequence of token ids")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 1 << 31):
            raise ValueError(f"donor {donor_id!r}: token ids must be in [0, 2**31)")
        self.remove_donor(donor_id)
        serial = self._next_serial
        self._next_serial += 1
        hashes: list[int] = []
        offsets: list[int] = []
        if arr.size >= self.anchor_tokens:
            window = self._window_hashes(arr)
            starts = np.arange(0, window.size, self.block_size)
            hashes = window[starts].tolist()
            offsets = starts.tolist()
        donor = _Donor(donor_id, serial, namespace, arr, hashes, offsets)
        self._donors[donor_id] = donor
        self._by_serial[serial] = donor
        if hashes:
            table = self._tables.setdefault(namespace, _ChunkTable())
            table.add(hashes, [serial << _OFFSET_BITS | off for off in offsets])

    def remove_donor(self, donor_id: str) -> bool:
        """Forget a donor (evicted, released). Returns False if it was not indexed."""
        donor = self._donors.pop(donor_id, None)
        if donor is None:
            return False
        del self._by_serial[donor.serial]
        table = self._tables.get(donor.namespace)
        if table is not None and donor.chunk_hashes:
            table.remove(donor.chunk_hashes, [donor.serial << _OFFSET_BITS | off for off in donor.chunk_offsets])
            if not table.postings:
                del self._tables[donor.namespace]
        return True

    def __contains__(self, donor_id: object) -> bool:
        return donor_id in self._donors

    def __len__(self) -> int:
        return len(self._donors)

    def donor_tokens(self, donor_id: str) -> Sequence[int] | None:
        """The donor's tokens (read-only numpy array), or None if unknown."""
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
    ) -> list[tuple[str, int, int, int]]:
        """Up to ``max_spans`` non-overlapping spans on the target, sorted by ``target_start``.

        Only donors of ``namespace`` (and, if given, in ``candidates``) are considered. Spans are
        block-aligned on the target side and at least ``min_span_tokens`` long. Called on the routing
        path: pass a numpy int64 array to skip the list conversion.
        """
        table = self._tables.get(namespace)
        if table is None or max_spans < 1:
            return []
        t = np.ascontiguousarray(target, dtype=np.int64)
        if t.ndim != 1 or t.size < max(self.anchor_tokens, self.min_span_tokens):
            return []
        allowed = self._allowed_serials(namespace, candidates)
        if allowed is not None and not allowed:
            return []
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
        found = self._runs(t, windows)
        return [
            (self._by_serial[c.serial].donor_id, c.start - c.delta, c.start, c.end - c.start)
            for c in self._choose(found, max_spans)
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

    def _diagonals(
        self, table: _ChunkTable, t: np.ndarray, allowed: set[int] | None
    ) -> dict[tuple[int, int], list[int]]:
        """Per (serial, delta) diagonal: [anchor hits, first hit position, last hit position]."""
        hashes = self._window_hashes(t)
        positions = table.screen(hashes)
        diagonals: dict[tuple[int, int], list[int]] = {}
        postings = table.postings
        cap = self.max_postings
        for pos, h in zip(positions.tolist(), hashes[positions].tolist(), strict=True):
            plist = postings.get(h)
            if plist is None:
                continue
            taken = 0
            for packed in reversed(plist):
                serial = packed >> _OFFSET_BITS
                if allowed is not None and serial not in allowed:
                    continue
                key = (serial, pos - (packed & _OFFSET_MASK))
                entry = diagonals.get(key)
                if entry is None:
                    diagonals[key] = [1, pos, pos]
                else:
                    entry[0] += 1
                    entry[2] = pos
                taken += 1
                if taken == cap:
                    break
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

        All windows are compared into one buffer separated by a mismatch, so run detection is one vectorized pass.
        """
        if not windows:
            return []
        eq = np.zeros(sum(hi - lo + 1 for _, _, lo, hi in windows) + 1, dtype=np.int8)
        offsets = np.empty(len(windows), dtype=np.int64)
        at = 1
        for i, (serial, delta, lo, hi) in enumerate(windows):
            d = self._by_serial[serial].tokens
            np.equal(t[lo:hi], d[lo - delta : hi - delta], out=eq[at : at + hi - lo].view(np.bool_))
            offsets[i] = at - lo  # buffer index - offset = target position
            at += hi - lo + 1
        edges = np.flatnonzero(np.diff(eq))
        starts = edges[0::2] + 1
        ends = edges[1::2] + 1
        which = np.searchsorted(np.cumsum([hi - lo + 1 for _, _, lo, hi in windows]), starts, side="right")
        bs = self.block_size
        first = -(-(starts - offsets[which]) // bs) * bs
        last = (ends - offsets[which]) // bs * bs
        keep = np.flatnonzero(last - first >= self.min_span_tokens)
        return [
            _Candidate(windows[w][0], s, e, windows[w][1])
            for w, s, e in zip(which[keep].tolist(), first[keep].tolist(), last[keep].tolist(), strict=True)
        ]

    def _choose(self, found: list[_Candidate], max_spans: int) -> list[_Candidate]:
        """Greedy cover: longest first, then a donor already used, then delta 0, then newest donor."""
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
        n = tokens.size
        a = self.anchor_tokens
        self._ensure_powers(n)
        prefix = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(tokens.view(np.uint64) * self._pow[:n], out=prefix[1:])
        return (prefix[a:] - prefix[: n - a + 1]) * self._inv_pow[: n - a + 1]

    def _ensure_powers(self, n: int) -> None:
        if self._pow.size >= n:
            return
        size = max(n, 2 * self._pow.size)
        self._pow = np.cumprod(np.full(size, _BASE, dtype=np.uint64)) * np.uint64(_BASE_INV)
        self._inv_pow = np.cumprod(np.full(size, _BASE_INV, dtype=np.uint64)) * np.uint64(_BASE)
