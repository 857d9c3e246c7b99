"""A compact map from u64 keys to u64 values for maps a router replica keeps per block (millions of entries).

A dict of Python ints costs ~100 bytes an entry (the entry, its index slot, two int objects); this one keeps its
entries in sorted numpy arrays (16 bytes an entry) on two levels, newest first:

* a small dict of recent single changes (and a set of recent deletions), merged into the level below once it holds
  more than 1,024 changes (or an eighth of the map);
* a sorted *overlay* level of up to ``32·√n`` entries (at least 4,096), each a value or a deletion, that overrides
  the base; batches of 64 changes or more go straight into it as arrays;
* the sorted *base* level, rewritten when the overlay outgrows its bound.

A bulk lookup finds keys in a large base through a *directory*: where each run of keys sharing their top bits starts
(16 to 32 keys a run, 4 bytes each: at most 1/4 byte a key), then a branchless binary search inside the run, all probes
at once. Binary searches of a base too large for the cache wait on a cache miss per step, one probe after another;
these gather a few neighbouring lines for every probe per step (block hashes are uniform, so the runs are short; keys
bunched into long runs fall back to plain binary search).

So a merge copies the overlay (``O(√n)``) per 1,024 changes and the base (``O(n)``) per ``√n`` changes: a change costs
``O(√n)`` element copies amortized (a single base level would cost ``O(n/1024)``, quadratic in bulk inserts), and a
lookup is a dict probe plus two binary searches.

The base is rewritten in steps, never all at once (at 800K entries one rewrite took ~25 ms, held the GIL, and so
stalled the router's event loop): the full overlay is *frozen* as a level between the overlay and the base, a new
overlay starts, and each later merge into the overlay also writes the next slice of the new base (base entries with
the frozen entries of their key range) into a separate array, so the old base serves every lookup until the new one
is complete and replaces it. A step's slice is paced by the merge that writes it: ``2·n/bound`` base entries for each
entry merged (so the rewrite ends by the time the new overlay is half full), at least ``_MIN_STEP`` and at most
``_MAX_STEP`` (16K) for a change of up to 1,024 entries (16 base entries an entry for a larger one), so a kv-event's
change writes a bounded slice whatever the map's size. The overlay may outgrow its bound while a rewrite is still in
progress (it is merged into the base once that rewrite ends); only past ``_OVERFLOW`` times its bound is the rest of
the rewrite written at once. The new base's directory is
written along with it, a slice per step, so no lookup builds one over a whole new base. Changes that stop mid-rewrite
would leave both bases in place: :meth:`U64Map.settle` writes the rest a bounded slice per call (the router's loop
calls it while the maps are quiet).

The bulk lookup (:meth:`U64Map._locate`), :meth:`U64Map.assign`'s writes in place and the merges into the overlay and
the new base (:func:`_merged`) run compiled where the package's library is built (``um_locate``, ``um_assign`` and
``um_merge`` in ``semblend_dynamo/_native/span_aligner.c``, one call each instead of a few dozen numpy operations; the
directory search a few probes at a time, a merge a linear pass that writes a rewrite's slice straight into the new
base): the numpy code here is the reference they match exactly, and the path without the library.
``SEMBLEND_NATIVE_MAP=0`` turns them off.

The router's exact-wins gate reads a few keys of every worker rank's map on each request
(:meth:`~semblend_dynamo.router.residency.Residency.stored_together`); where the planner's extension module is built
(``_native/planner.c``, :mod:`semblend_dynamo.native_planner`) it does so in one compiled call (:data:`NATIVE_GATE`),
and each map keeps the addresses and lengths of its sorted levels for it (``_view``, made by :data:`NATIVE_LEVELS`
wherever a level is replaced: an array's address costs microseconds to read from Python, a dozen per map). The same
variable turns it off.

Reads without a lock: every change marks the map busy while it runs and counts itself (:meth:`U64Map.quiet`), so a
reader on another thread can tell whether a change overlapped its reads (a seqlock under the GIL).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sysconfig
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from math import isqrt
from typing import Any, TypeVar, cast

import numpy as np

from semblend_dynamo._native import array_address, held_library
from semblend_dynamo._native.build import PLANNER_SOURCE
from semblend_dynamo._native.modules import ExtensionModule
from semblend_dynamo._native.modules import disabled as switched_off

_U64 = np.uint64
_MIN_DELTA = 64
_MAX_DELTA = 1024
"""Changes held in the dict before a merge: at most an eighth of the sorted entries, within these bounds (a map per
worker and kind, so the dicts' memory counts: 1024 entries cost ~100 KB)."""
_MIN_OVERLAY = 4096
_OVERLAY_PER_ROOT = 32
"""The overlay is merged into the base past ``max(_MIN_OVERLAY, _OVERLAY_PER_ROOT·√base)`` entries (about
``√(1024·n)``, which balances the two merges' copying)."""
_BULK = 64
"""A batch of at least this many keys is merged into the overlay at once (and a lookup of as many first merges the
dict, to probe arrays only)."""
_MIN_STEP = 4096
_MAX_STEP = 16_384
_STEP_PER_CHANGE = 16
"""A base rewrite step writes ``2·n/bound`` base entries for each entry merged into the overlay, at least
``_MIN_STEP`` and at most ``max(_MAX_STEP, _STEP_PER_CHANGE·k)`` for a merge of ``k`` entries (a bulk insert's steps
grow with it, so its rewrites keep pace with its overlay)."""
_OVERFLOW = 4
"""While a rewrite is in progress the overlay may grow to this many times its bound before the rewrite is finished at
once (a bulk insert: kv-events' changes are paced to end the rewrite long before)."""
_DIR_MIN = 1 << 15
"""Base entries from which a bulk lookup goes through the directory (below, binary search was as fast on the 2-core
VM: the base's lines stay in the cache)."""
_DIR_RUN_BITS = 4
"""The directory has a run per ``2**_DIR_RUN_BITS`` to ``2**(_DIR_RUN_BITS + 1)`` base keys."""
_DIR_MAX_STEPS = 8
"""A run of ``2**_DIR_MAX_STEPS`` keys or more: the keys are not uniform, the base is searched without a directory."""


NATIVE_ENV = "SEMBLEND_NATIVE_MAP"


def _load_native() -> tuple[Any, Any, Any, str]:
    """``um_locate``, ``um_assign`` and ``um_merge`` (None each where not used), and why (not)."""
    if switched_off(NATIVE_ENV):
        return None, None, None, f"{NATIVE_ENV}={os.environ[NATIVE_ENV]}"
    if np.dtype(np.intp).itemsize != 8:
        return None, None, None, "positions are not 64-bit"
    lib, reason = held_library()
    if lib is None:
        return None, None, None, reason
    locate, assign, merge = lib.um_locate, lib.um_assign, lib.um_merge
    locate.argtypes, locate.restype = (ctypes.c_void_p,), None
    assign.argtypes, assign.restype = (ctypes.c_void_p,), ctypes.c_int64
    merge.argtypes, merge.restype = (ctypes.c_void_p,), ctypes.c_int64
    return locate, assign, merge, reason


NATIVE_LOCATE, NATIVE_ASSIGN, NATIVE_MERGE, NATIVE_REASON = _load_native()
"""The compiled bulk lookup, write and merge (None: the numpy path), and why."""


_F = TypeVar("_F", bound=Callable[..., Any])


def _change(method: _F) -> _F:
    """A method that changes the map: the map is busy while it runs, and counts it (see :meth:`U64Map.quiet`)."""

    @functools.wraps(method)
    def changing(self: U64Map, *args: Any, **kwargs: Any) -> Any:
        self._busy += 1  # before the count: a reader that saw the count before it sees the map busy
        self._changes += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            self._busy -= 1

    return cast(_F, changing)


def _empty() -> np.ndarray:
    return np.empty(0, dtype=_U64)


def _dir_shift(n: int) -> np.uint64:
    """The shift of a directory for ``n`` keys: runs of ``2**_DIR_RUN_BITS`` keys or more of uniform keys."""
    return _U64(64 - max(1, n.bit_length() - 1 - _DIR_RUN_BITS))


def _hits(keys: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(found, at)``: whether each of ``probe`` is in the sorted non-empty ``keys``, and where."""
    at = np.minimum(keys.searchsorted(probe), len(keys) - 1)
    return keys[at] == probe, at


class _Located:
    """Where the keys of a bulk lookup are on the sorted levels (valid while the levels' arrays stay the same and
    the dict of recent changes is empty: :meth:`U64Map.assign` reuses it then)."""

    __slots__ = ("base_at", "base_hit", "found", "over_at", "over_hit", "probe")

    def __init__(
        self,
        probe: np.ndarray,
        found: np.ndarray,
        over_hit: np.ndarray,
        over_at: np.ndarray,
        base_hit: np.ndarray,
        base_at: np.ndarray,
    ) -> None:
        self.probe, self.found = probe, found
        self.over_hit, self.over_at = over_hit, over_at
        self.base_hit, self.base_at = base_hit, base_at


def _interleave(old: tuple[np.ndarray, ...], new: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Sorted columns ``old`` and ``new`` (keys first, distinct across both) as one sorted set of columns."""
    at = old[0].searchsorted(new[0]) + np.arange(len(new[0]))
    kept = np.ones(len(old[0]) + len(new[0]), dtype=bool)
    kept[at] = False
    out = []
    for held, added in zip(old, new, strict=True):
        column = np.empty(len(kept), dtype=held.dtype)
        column[at] = added
        column[kept] = held
        out.append(column)
    return tuple(out)


def _merged(old: tuple[np.ndarray, ...], new: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Sorted, distinct-key columns ``new`` (keys, values, live) merged into ``old`` (keys, values, and live for the
    overlay; none for a base slice), in key order: a new entry replaces the old entry of its key; into a base slice a
    dead new entry only removes its key. The reference of :func:`_merge_native` (``um_merge``)."""
    if len(old[0]) and len(new[0]):
        replaced, at = _hits(old[0], new[0])
        if replaced.any():
            keep = np.ones(len(old[0]), dtype=bool)
            keep[at[replaced]] = False
            old = tuple(column[keep] for column in old)
    if len(old) < len(new):
        live = new[2]
        new = (new[0][live], new[1][live])
    return _interleave(old, new)


def _merge_native(old: tuple[np.ndarray, ...], new: tuple[np.ndarray, ...], out: tuple[np.ndarray, ...]) -> int:
    """:func:`_merged` written to the start of ``out`` (columns as ``old``'s, room for every old and new entry) in one
    compiled call (``um_merge``); how many entries it wrote."""
    has_live = len(old) == 3
    args = array(
        "q",
        (
            array_address(old[0]),
            array_address(old[1]),
            array_address(old[2]) if has_live else 0,
            len(old[0]),
            array_address(new[0]),
            array_address(new[1]),
            array_address(new[2]),
            len(new[0]),
            array_address(out[0]),
            array_address(out[1]),
            array_address(out[2]) if has_live else 0,
        ),
    )
    return int(NATIVE_MERGE(args.buffer_info()[0]))


class U64Map:
    """``dict[int, int]`` for keys and values in ``[0, 2**64)``, kept compact (see the module docstring)."""

    __slots__ = (
        "_busy",
        "_changes",
        "_delta",
        "_dir",
        "_dir_shift",
        "_dir_steps",
        "_done",
        "_frozen_keys",
        "_frozen_live",
        "_frozen_values",
        "_gone",
        "_keys",
        "_len",
        "_live",
        "_located",
        "_next_dir",
        "_next_dir_at",
        "_next_dir_shift",
        "_next_keys",
        "_next_values",
        "_over_keys",
        "_over_values",
        "_values",
        "_view",
        "_written",
    )

    def __init__(self) -> None:
        self._keys = _empty()  # the base level
        self._values = _empty()
        self._dir: np.ndarray | None = None  # the base's directory, built on demand (_base_hits)
        self._dir_shift = _U64(0)
        self._dir_steps = 0  # 0: no directory for this base
        self._over_keys = _empty()  # the overlay level; _live False: the key was deleted
        self._over_values = _empty()
        self._live = np.empty(0, dtype=bool)
        self._delta: dict[int, int] = {}
        self._gone: set[int] = set()  # deleted since the last merge (never also in _delta)
        self._len = 0
        self._located: _Located | None = None  # the last bulk lookup's positions, while the levels stay as they are
        self._busy = 0  # changes running (nested calls count each)
        self._changes = 0  # changes started
        self._view: tuple[Any, ...] | None = None  # the levels' addresses for the compiled gate (_levels_replaced)
        self._reset_rewrite()

    def _reset_rewrite(self) -> None:
        """No base rewrite in progress: no frozen level, no new base."""
        self._frozen_keys = _empty()  # the overlay being written into the new base; _frozen_live as _live
        self._frozen_values = _empty()
        self._frozen_live = np.empty(0, dtype=bool)
        self._next_keys = _empty()  # the new base, written up to _written
        self._next_values = _empty()
        self._done = (0, 0)  # base and frozen entries written so far
        self._written = 0
        self._next_dir: np.ndarray | None = None  # the new base's directory, written up to run _next_dir_at
        self._next_dir_shift = _U64(0)
        self._next_dir_at = 0
        self._levels_replaced()

    def _levels_replaced(self) -> None:
        """A sorted level's arrays were replaced: the compiled gate's view of them (where it is used) follows. Every
        assignment of a level's arrays is followed by this (an array written in place keeps its address)."""
        if NATIVE_LEVELS is not None:
            self._view = NATIVE_LEVELS(
                self._over_keys,
                self._over_values,
                self._live,
                self._frozen_keys,
                self._frozen_values,
                self._frozen_live,
                self._keys,
                self._values,
            )

    def __len__(self) -> int:
        return self._len

    def quiet(self) -> int | None:
        """How many changes have started, or None while one is running (on any thread): reads made without a lock
        while another thread may change the map saw one state of it if this gives the same number before and after
        them, and not None."""
        changes = self._changes  # the count first: a change starting after it shows in the count or as busy
        return None if self._busy else changes

    # --- reads -----------------------------------------------------------------------------------
    def _levels(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, values)`` of the u64 array ``probe`` on the sorted levels (a value is 0 where not found)."""
        found, values, _ = self._locate(probe)
        return found, values

    def _locate(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray, _Located]:
        """:meth:`_levels`, with where each probe is on each level."""
        if NATIVE_LOCATE is not None and len(probe):
            return self._locate_native(probe)
        return self._locate_numpy(probe)

    def _locate_native(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray, _Located]:
        """:meth:`_locate_numpy` in one compiled call (``um_locate``)."""
        n, keys = len(probe), self._keys
        held = np.ascontiguousarray(probe, dtype=_U64)
        steps, directory = 0, 0
        if len(keys) >= _DIR_MIN and n >= _BULK:  # as _base_hits
            if self._dir is None:
                self._build_dir()
            if self._dir_steps:
                assert self._dir is not None
                steps, directory = self._dir_steps, array_address(self._dir)
        found, over_hit, base_hit = np.empty(n, dtype=bool), np.empty(n, dtype=bool), np.empty(n, dtype=bool)
        values = np.empty(n, dtype=_U64)
        over_at, base_at = np.empty(n, dtype=np.intp), np.empty(n, dtype=np.intp)
        args = array(
            "q",
            (
                array_address(held),
                n,
                array_address(keys),
                array_address(self._values),
                len(keys),
                directory,
                int(self._dir is not None and self._dir.itemsize == 8),
                int(self._dir_shift),
                steps,
                array_address(self._frozen_keys),
                array_address(self._frozen_values),
                array_address(self._frozen_live),
                len(self._frozen_keys),
                array_address(self._over_keys),
                array_address(self._over_values),
                array_address(self._live),
                len(self._over_keys),
                array_address(found),
                array_address(values),
                array_address(over_hit),
                array_address(over_at),
                array_address(base_hit),
                array_address(base_at),
            ),
        )
        NATIVE_LOCATE(args.buffer_info()[0])
        return found, values, _Located(probe, found, over_hit, over_at, base_hit, base_at)

    def _locate_numpy(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray, _Located]:
        """:meth:`_locate` in numpy (the reference)."""
        n = len(probe)
        if n and len(self._keys):
            base_hit, base_at = self._base_hits(probe)
            found = base_hit
            values = self._values[base_at]
        else:
            found, values = np.zeros(n, dtype=bool), np.zeros(n, dtype=_U64)
            base_hit, base_at = found, np.zeros(n, dtype=np.intp)
        if n and len(self._frozen_keys):
            frozen, at = _hits(self._frozen_keys, probe)
            found = np.where(frozen, self._frozen_live[at], found)
            values = np.where(frozen, self._frozen_values[at], values)
        if n and len(self._over_keys):
            over_hit, over_at = _hits(self._over_keys, probe)
            found = np.where(over_hit, self._live[over_at], found)
            values = np.where(over_hit, self._over_values[over_at], values)
        else:
            over_hit, over_at = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.intp)
        return found, np.where(found, values, _U64(0)), _Located(probe, found, over_hit, over_at, base_hit, base_at)

    def _base_hits(self, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`_hits` of ``probe`` on the non-empty base, through its directory where it has one."""
        keys = self._keys
        if len(keys) < _DIR_MIN or len(probe) < _BULK:
            return _hits(keys, probe)
        if self._dir is None:
            self._build_dir()
        if not self._dir_steps:
            return _hits(keys, probe)
        assert self._dir is not None
        # lower bound of each probe in a window of 2**steps - 1 keys from the start of its run (moved back to end at
        # the base's last key where it would pass it): keys before the run are smaller than the probe, keys after it
        # larger, and the window covers the longest run
        width = 1 << self._dir_steps
        at = np.minimum(self._dir[probe >> self._dir_shift], len(keys) - width).astype(np.intp)
        step = width
        while step > 1:
            step >>= 1
            np.add(at, step, out=at, where=keys[at + (step - 1)] < probe)
        return keys[at] == probe, at

    def _build_dir(self) -> None:
        keys = self._keys
        shift = _dir_shift(len(keys))
        self._take_dir(keys.searchsorted(np.arange(1 << (64 - int(shift)), dtype=_U64) << shift), shift)

    def _take_dir(self, starts: np.ndarray, shift: np.uint64) -> None:
        """The base's directory: where each run of keys sharing their top ``64 - shift`` bits starts."""
        n = len(self._keys)
        longest = int(np.diff(starts, append=n).max())
        steps = longest.bit_length()
        self._dir_shift = shift
        self._dir_steps = steps if steps <= _DIR_MAX_STEPS and 1 << steps <= n else 0
        self._dir = starts.astype(np.int32 if n < 1 << 31 else np.int64) if self._dir_steps else _empty()

    def _set_base(self, keys: np.ndarray, values: np.ndarray) -> None:
        self._keys, self._values = keys, values
        self._dir, self._dir_steps = None, 0
        self._levels_replaced()

    def get(self, key: int) -> int | None:
        held = self._delta.get(key)
        if held is not None:
            return held
        if self._gone and key in self._gone:
            return None
        # Binary searches over each level's memory, read as Python ints (exact), which keep the GIL (numpy's
        # searchsorted lets it go): the exact-wins gate runs this on the event loop just before the compiled span
        # search, and a thread waiting for the GIL (Dynamo's runtime with an answer) should get it in that search.
        for keys, values, live in (
            (self._over_keys, self._over_values, self._live),
            (self._frozen_keys, self._frozen_values, self._frozen_live),
        ):
            if len(keys):
                at = keys.data
                i = bisect_left(at, key)
                if i < len(at) and at[i] == key:
                    return int(values[i]) if live[i] else None
        if len(self._keys):
            at = self._keys.data
            i = bisect_left(at, key)
            if i < len(at) and at[i] == key:
                return int(self._values[i])
        return None

    def _levels_many(self, keys: Sequence[int]) -> list[int | None]:
        if not keys or not (len(self._keys) or len(self._over_keys) or len(self._frozen_keys)):
            return [None] * len(keys)
        found, values = self._levels(np.asarray(keys, dtype=_U64))
        return [v if f else None for v, f in zip(values.tolist(), found.tolist(), strict=True)]

    def get_many(self, keys: Sequence[int]) -> list[int | None]:
        """:meth:`get` for many keys (one binary search a level for all of them)."""
        out = self._levels_many(keys)
        delta, gone = self._delta, self._gone
        if delta or gone:
            for i, key in enumerate(keys):
                if key in delta:
                    out[i] = delta[key]
                elif key in gone:
                    out[i] = None
        return out

    @_change
    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`get_many` for a u64 array: ``(found, values)`` arrays (a value is 0 where not found)."""
        if len(keys) >= _BULK:
            self._merge_delta()
            found, values, self._located = self._locate(keys)  # for an assign of the same keys that may follow
            return found, values
        found, values = self._levels(keys)
        delta, gone = self._delta, self._gone
        if delta or gone:
            for i, key in enumerate(keys.tolist()):
                if key in delta:
                    found[i], values[i] = True, delta[key]
                elif key in gone:
                    found[i], values[i] = False, 0
        return found, values

    def __contains__(self, key: int) -> bool:
        return self.get(key) is not None

    def items(self) -> Iterator[tuple[int, int]]:
        """Every ``(key, value)``, in key order (a snapshot: the map may change while it is walked)."""
        keys, values = self.arrays()
        return zip(keys.tolist(), values.tolist(), strict=True)

    @_change
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every key and its value as sorted u64 arrays (the map's own: valid until it next changes)."""
        self._merge_delta()
        self._merge_overlay()
        self._finish_rewrite()
        return self._keys, self._values

    # --- writes ----------------------------------------------------------------------------------
    @_change
    def assign(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Set distinct keys given as a sorted u64 array: a key a sorted level holds gets its value written in place
        there (no merge copies it), the others are inserted as :meth:`set_many` inserts them. Right after a
        :meth:`lookup` of the same array, its binary searches are reused."""
        if len(keys) < _BULK:
            self.set_many(keys.tolist(), values.tolist())
            return
        self._merge_delta()
        located = self._located
        if located is None or located.probe is not keys:
            located = self._locate(keys)[2]
        self._located = None
        if NATIVE_ASSIGN is not None:
            self._assign_native(keys, values, located)
            return
        over = located.over_hit
        at = located.over_at[over]
        self._len += len(at) - int(np.count_nonzero(self._live[at]))
        self._over_values[at] = values[over]
        self._live[at] = True
        if len(self._frozen_keys):  # a rewrite in progress: the base is being copied, so the rest goes to the overlay
            rest = ~over
            self._len += int(np.count_nonzero(rest & ~located.found))
            if rest.any():
                self._overlay(keys[rest], values[rest], np.ones(int(np.count_nonzero(rest)), dtype=bool), absent=True)
            return
        base = located.base_hit & ~over
        self._values[located.base_at[base]] = values[base]
        rest = ~(over | base)
        if rest.any():
            self._len += int(np.count_nonzero(rest))
            self._overlay(keys[rest], values[rest], np.ones(int(np.count_nonzero(rest)), dtype=bool), absent=True)

    def _assign_native(self, keys: np.ndarray, values: np.ndarray, located: _Located) -> None:
        """:meth:`assign`'s writes in place in one compiled call (``um_assign``), then the rest into the overlay."""
        held = np.ascontiguousarray(values, dtype=_U64)
        rest = np.empty(len(keys), dtype=bool)
        args = array(
            "q",
            (
                array_address(held),
                len(keys),
                array_address(located.found),
                array_address(located.over_hit),
                array_address(located.over_at),
                array_address(located.base_hit),
                array_address(located.base_at),
                array_address(self._over_values),
                array_address(self._live),
                array_address(self._values),
                int(bool(len(self._frozen_keys))),
                array_address(rest),
            ),
        )
        counts = NATIVE_ASSIGN(args.buffer_info()[0])
        self._len += counts & 0xFFFFFFFF
        left = counts >> 32
        if left:
            self._overlay(keys[rest], held[rest], np.ones(left, dtype=bool), absent=True)

    @_change
    def set_many(self, keys: Sequence[int], values: Sequence[int], held: Sequence[int | None] | None = None) -> None:
        """Set distinct ``keys``; ``held`` (their values now, from :meth:`get_many`) spares looking them up again."""
        if held is None:
            held = self.get_many(keys)
        self._len += sum(1 for h in held if h is None)
        if len(keys) >= _BULK:
            self._merge_delta()
            self._overlay(np.asarray(keys, dtype=_U64), np.asarray(values, dtype=_U64), np.ones(len(keys), dtype=bool))
            return
        self._delta.update(zip(keys, values, strict=True))
        if self._gone:
            self._gone.difference_update(keys)
        self._changed()

    @_change
    def __setitem__(self, key: int, value: int) -> None:
        if self.get(key) is None:
            self._len += 1
        self._delta[key] = value
        self._gone.discard(key)
        self._changed()

    @_change
    def pop_many(self, keys: Sequence[int]) -> list[int | None]:
        """Remove ``keys`` in turn; the value each had (None: absent, or named twice)."""
        delta, gone = self._delta, self._gone
        out: list[int | None] = []
        for key, on_levels in zip(keys, self._levels_many(keys), strict=True):
            if key in delta:
                held: int | None = delta.pop(key)
                if on_levels is not None:
                    gone.add(key)
            elif key in gone:
                held = None
            else:
                held = on_levels
                if held is not None:
                    gone.add(key)
            if held is not None:
                self._len -= 1
            out.append(held)
        self._changed()
        return out

    def pop(self, key: int) -> int | None:
        """Remove ``key``; its value, or None if absent."""
        return self.pop_many((key,))[0]

    @_change
    def clear(self) -> None:
        self._located = None
        self._set_base(_empty(), _empty())
        self._over_keys, self._over_values, self._live = _empty(), _empty(), np.empty(0, dtype=bool)
        self._delta.clear()
        self._gone.clear()
        self._len = 0
        self._reset_rewrite()

    # --- merges ----------------------------------------------------------------------------------
    def _changed(self) -> None:
        held = len(self._delta) + len(self._gone)
        if held > max(_MIN_DELTA, min(_MAX_DELTA, (len(self._keys) + len(self._over_keys)) >> 3)):
            self._merge_delta()

    def _merge_delta(self) -> None:
        """Move the dict's changes into the overlay (a deletion only of a key a level holds)."""
        delta, gone = self._delta, self._gone
        if not (delta or gone):
            return
        keys = np.fromiter(delta.keys(), dtype=_U64, count=len(delta))
        values = np.fromiter(delta.values(), dtype=_U64, count=len(delta))
        live = np.ones(len(keys), dtype=bool)
        if gone:
            deleted = np.fromiter(gone, dtype=_U64, count=len(gone))
            held = np.zeros(len(deleted), dtype=bool)
            for level in (self._keys, self._frozen_keys, self._over_keys):
                if len(level):
                    held |= _hits(level, deleted)[0]
            deleted = deleted[held]
            keys = np.concatenate((keys, deleted))
            values = np.concatenate((values, np.zeros(len(deleted), dtype=_U64)))
            live = np.concatenate((live, np.zeros(len(deleted), dtype=bool)))
        delta.clear()
        gone.clear()
        self._overlay(keys, values, live)

    def _overlay(self, keys: np.ndarray, values: np.ndarray, live: np.ndarray, absent: bool = False) -> None:
        """Merge distinct ``keys`` (any order; ``live`` False: deleted; ``absent``: none is in the overlay) into the
        overlay, replacing its entries of the same keys; then the overlay into the base if it outgrew its bound."""
        order = np.argsort(keys)
        keys, values, live = keys[order].astype(_U64, copy=False), values[order].astype(_U64, copy=False), live[order]
        held = (self._over_keys, self._over_values, self._live)
        self._located = None
        if NATIVE_MERGE is not None:
            room = len(held[0]) + len(keys)
            out = (np.empty(room, dtype=_U64), np.empty(room, dtype=_U64), np.empty(room, dtype=bool))
            end = _merge_native(held, (keys, values, live), out)
            self._over_keys, self._over_values, self._live = out[0][:end], out[1][:end], out[2][:end]
        elif absent:  # no key to replace
            self._over_keys, self._over_values, self._live = _interleave(held, (keys, values, live))
        else:
            self._over_keys, self._over_values, self._live = _merged(held, (keys, values, live))
        self._levels_replaced()
        bound = max(_MIN_OVERLAY, _OVERLAY_PER_ROOT * isqrt(len(self._keys)))
        if not len(self._frozen_keys):
            if len(self._over_keys) > bound:
                self._merge_overlay()
        elif len(self._over_keys) > _OVERFLOW * bound:
            self._merge_overlay()  # a bulk insert outran the rewrite: finished at once
        else:
            # paced to end the rewrite by the time the new overlay is half full, a bounded slice whatever the base
            paced = 2 * len(keys) * len(self._keys) // bound
            self._rewrite_step(min(max(_MAX_STEP, _STEP_PER_CHANGE * len(keys)), max(_MIN_STEP, paced)))

    def _merge_overlay(self) -> None:
        """Freeze the overlay and start rewriting the base with it (finishing a rewrite still in progress first)."""
        if not len(self._over_keys):
            return
        self._finish_rewrite()
        live = self._live
        self._located = None
        self._frozen_keys, self._frozen_values, self._frozen_live = self._over_keys, self._over_values, live
        self._over_keys, self._over_values, self._live = _empty(), _empty(), np.empty(0, dtype=bool)
        self._levels_replaced()
        size = len(self._keys) + int(np.count_nonzero(live))  # at most: frozen keys may replace base keys
        self._next_keys = np.empty(size, dtype=_U64)
        self._next_values = np.empty(size, dtype=_U64)
        if size >= _DIR_MIN:  # its directory is written along with it (runs a little shorter if keys are deleted)
            self._next_dir_shift = _dir_shift(size)
            self._next_dir = np.empty(1 << (64 - int(self._next_dir_shift)), dtype=np.int64)
        self._rewrite_step(_MIN_STEP)

    @property
    def rewriting(self) -> bool:
        """Whether a base rewrite is in progress (the old base and the part of the new one written are both held)."""
        return bool(len(self._frozen_keys))

    @property
    def rewrite_left(self) -> int:
        """Entries of the base and of the frozen level a rewrite in progress has still to write (0: none)."""
        if not len(self._frozen_keys):
            return 0
        base_at, frozen_at = self._done
        return len(self._keys) - base_at + len(self._frozen_keys) - frozen_at

    def settle(self, entries: int) -> tuple[int, int]:
        """Write the next ``entries`` base entries (and the frozen ones of their range) of a rewrite in progress:
        changes that stop mid-rewrite would leave it, and both bases, in place. ``(written, left)`` in entries;
        ``(0, 0)`` with no rewrite in progress (then it is not a change)."""
        left = self.rewrite_left
        if not left:
            return 0, 0
        self._settle_step(entries)
        now = self.rewrite_left
        return left - now, now

    @_change
    def _settle_step(self, entries: int) -> None:
        self._rewrite_step(entries)

    def _finish_rewrite(self) -> None:
        if self.rewriting:
            self._rewrite_step(len(self._keys))

    def _rewrite_step(self, entries: int) -> None:
        """Write the next ``entries`` base entries (or the rest), merged with the frozen entries of their key range,
        into the new base, and their runs into its directory; the last step makes the new base the base."""
        keys, frozen = self._keys, self._frozen_keys
        base_at, frozen_at = self._done
        base_end = min(len(keys), base_at + max(1, entries))
        # frozen keys below the next step's first base key belong to this step (an equal key replaces it there)
        frozen_end = int(frozen.searchsorted(keys[base_end])) if base_end < len(keys) else len(frozen)
        old = (keys[base_at:base_end], self._values[base_at:base_end])
        new = tuple(level[frozen_at:frozen_end] for level in (frozen, self._frozen_values, self._frozen_live))
        if NATIVE_MERGE is not None:  # straight into the new base (sized for every base and live frozen entry)
            end = self._written + _merge_native(
                old, new, (self._next_keys[self._written :], self._next_values[self._written :])
            )
        else:
            merged_keys, merged_values = _merged(old, new)
            end = self._written + len(merged_keys)
            self._next_keys[self._written : end] = merged_keys
            self._next_values[self._written : end] = merged_values
        merged_keys = self._next_keys[self._written : end]
        starts = self._next_dir
        if starts is not None and len(merged_keys):
            # the runs starting in this slice: each run's first key is here (the slices before end below it)
            shift, first = self._next_dir_shift, self._next_dir_at
            last = int(merged_keys[-1] >> shift)
            if last >= first:
                bounds = np.arange(first, last + 1, dtype=_U64) << shift
                starts[first : last + 1] = merged_keys.searchsorted(bounds) + self._written
                self._next_dir_at = last + 1
        self._written, self._done = end, (base_end, frozen_end)
        if base_end == len(keys) and frozen_end == len(frozen):
            self._set_base(self._next_keys[:end], self._next_values[:end])
            if starts is not None:
                starts[self._next_dir_at :] = end
                self._take_dir(starts, self._next_dir_shift)
            self._located = None
            self._reset_rewrite()


def _load_gate() -> tuple[Any, Any, str]:
    """The compiled gate's ``levels`` and ``stored_together`` (``_native/planner.c``; None each where not used), and
    why (not)."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None, None, "free-threaded Python: the compiled gate reads the maps under the GIL"
    levels, reason = _LEVELS.use((U64Map,))
    if levels is None:
        return None, None, reason
    gate, reason = _GATE.use((U64Map,))
    return (levels, gate, reason) if gate is not None else (None, None, reason)


_LEVELS, _GATE = (
    ExtensionModule(PLANNER_SOURCE, NATIVE_ENV, "python -m semblend_dynamo.native_planner", entry, "setup_gate")
    for entry in ("levels", "stored_together")
)
NATIVE_LEVELS, NATIVE_GATE, NATIVE_GATE_REASON = _load_gate()
"""The compiled gate (:meth:`~semblend_dynamo.router.residency.Residency.stored_together`) and the maps' views of
their levels for it (None each: the gate's Python path), and why."""
