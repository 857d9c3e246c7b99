"""A compact map from u64 keys to u64 values for maps a router replica keeps per block (millions of entries).

A dict of Python ints costs ~100 bytes an entry (the entry, its index slot, two int objects); this one keeps its
entries in two sorted numpy arrays (16 bytes an entry) and recent changes in a small dict that is merged into them
when it grows past an eighth of them, so a write stays O(1) amortized and a lookup is a dict probe plus a binary
search.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

_U64 = np.uint64
_GONE = None  # a delta value: the key was deleted from the sorted arrays
_MIN_DELTA = 64
_MAX_DELTA = 1024
"""Changes held before a merge: at most an eighth of the sorted entries, within these bounds (a map per worker and
kind, so the dicts' memory counts: 1024 entries cost ~100 KB)."""


class U64Map:
    """``dict[int, int]`` for keys and values in ``[0, 2**64)``, kept compact (see the module docstring)."""

    __slots__ = ("_delta", "_keys", "_len", "_values")

    def __init__(self) -> None:
        self._keys = np.empty(0, dtype=_U64)
        self._values = np.empty(0, dtype=_U64)
        self._delta: dict[int, int | None] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def _merge_due(self) -> bool:
        return len(self._delta) > max(_MIN_DELTA, min(_MAX_DELTA, len(self._keys) >> 3))

    def _base(self, key: int) -> int | None:
        keys = self._keys
        i = int(keys.searchsorted(key))
        return int(self._values[i]) if i < len(keys) and int(keys[i]) == key else None

    def get(self, key: int) -> int | None:
        delta = self._delta
        if key in delta:
            return delta[key]
        return self._base(key) if len(self._keys) else None

    def _base_many(self, keys: Sequence[int]) -> list[int | None]:
        base = self._keys
        if not len(base) or not keys:
            return [None] * len(keys)
        probe = np.asarray(keys, dtype=_U64)
        at = np.minimum(base.searchsorted(probe), len(base) - 1)
        found = (base[at] == probe).tolist()
        return [v if f else None for v, f in zip(self._values[at].tolist(), found, strict=True)]

    def get_many(self, keys: Sequence[int]) -> list[int | None]:
        """:meth:`get` for many keys (one binary search for all of them)."""
        out = self._base_many(keys)
        delta = self._delta
        if delta:
            for i, key in enumerate(keys):
                if key in delta:
                    out[i] = delta[key]
        return out

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`get_many` for a u64 array: ``(found, values)`` arrays (a value is 0 where not found)."""
        found = np.zeros(len(keys), dtype=bool)
        values = np.zeros(len(keys), dtype=_U64)
        base = self._keys
        if len(base) and len(keys):
            at = np.minimum(base.searchsorted(keys), len(base) - 1)
            found = base[at] == keys
            values = np.where(found, self._values[at], _U64(0))
        delta = self._delta
        if delta:
            for i, key in enumerate(keys.tolist()):
                if key in delta:
                    held = delta[key]
                    found[i] = held is not None
                    values[i] = 0 if held is None else held
        return found, values

    def add_absent(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Set distinct keys known to be absent (from :meth:`lookup`), given as u64 arrays."""
        self._len += len(keys)
        self._delta.update(zip(keys.tolist(), values.tolist(), strict=True))
        if self._merge_due():
            self._merge()

    def set_many(self, keys: Sequence[int], values: Sequence[int], held: Sequence[int | None] | None = None) -> None:
        """Set distinct ``keys``; ``held`` (their values now, from :meth:`get_many`) spares looking them up again."""
        if held is None:
            held = self.get_many(keys)
        self._len += sum(1 for h in held if h is None)
        self._delta.update(zip(keys, values, strict=True))
        if self._merge_due():
            self._merge()

    def pop_many(self, keys: Sequence[int]) -> list[int | None]:
        """Remove ``keys`` in turn; the value each had (None: absent, or named twice)."""
        delta = self._delta
        out: list[int | None] = []
        for key, in_base in zip(keys, self._base_many(keys), strict=True):
            if key in delta:
                held = delta[key]
                if held is not None:
                    if in_base is None:
                        del delta[key]
                    else:
                        delta[key] = _GONE
            else:
                held = in_base
                if held is not None:
                    delta[key] = _GONE
            if held is not None:
                self._len -= 1
            out.append(held)
        if self._merge_due():
            self._merge()
        return out

    def __contains__(self, key: int) -> bool:
        return self.get(key) is not None

    def __setitem__(self, key: int, value: int) -> None:
        delta = self._delta
        held = delta[key] if key in delta else (self._base(key) if len(self._keys) else None)
        if held is None:
            self._len += 1
        delta[key] = value
        if self._merge_due():
            self._merge()

    def pop(self, key: int) -> int | None:
        """Remove ``key``; its value, or None if absent."""
        return self.pop_many((key,))[0]

    def clear(self) -> None:
        self._keys = np.empty(0, dtype=_U64)
        self._values = np.empty(0, dtype=_U64)
        self._delta.clear()
        self._len = 0

    def items(self) -> Iterator[tuple[int, int]]:
        """Every ``(key, value)``, in key order (a snapshot: the map may change while it is walked)."""
        self._merge()
        return zip(self._keys.tolist(), self._values.tolist(), strict=True)

    def _merge(self) -> None:
        delta = self._delta
        if not delta:
            return
        changed = np.fromiter(delta.keys(), dtype=_U64, count=len(delta))
        keys, values = self._keys, self._values
        if len(keys):
            at = np.minimum(keys.searchsorted(changed), len(keys) - 1)
            stale = at[keys[at] == changed]
            if len(stale):
                keep = np.ones(len(keys), dtype=bool)
                keep[stale] = False
                keys, values = keys[keep], values[keep]
        held = list(delta.values())
        live = np.fromiter((v is not None for v in held), dtype=bool, count=len(held))
        if live.any():
            added = np.fromiter((v or 0 for v in held), dtype=_U64, count=len(held))[live]
            changed = changed[live]
            order = np.argsort(changed)
            at = keys.searchsorted(changed[order])
            keys, values = np.insert(keys, at, changed[order]), np.insert(values, at, added[order])
        self._keys, self._values = keys, values
        delta.clear()
