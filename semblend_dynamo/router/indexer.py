"""The discovery pipeline's feed: one background thread applies the catalog's donor changes, in order.

Indexing a donor (hashing its tokens for spans, inserting its embedding in an index of 100K) takes milliseconds;
done where the catalog decides it (the event loop, on a kv-event) it delayed every request that arrived meanwhile.
:class:`PipelineIndexer` takes those changes instead: :class:`~semblend_dynamo.router.catalog.DonorCatalog` queues
them under its own lock (so the queue holds them in the order the catalog decided them, and a removal is never
overtaken by an older add), and the one ``semblend-indexer`` thread applies them to
:class:`~semblend_dynamo.pipeline.DonorDiscovery`. Donors the pipeline evicts for capacity go back to the catalog
(``on_evicted``, called with no pipeline lock held), and the owners of applied adds go back through ``on_indexed``
(the catalog then drops its copy of a vector the search index holds).

Bounds: at most ``max_pending`` queued adds, of which at most ``max_local`` carry a prompt's tokens; an add beyond
them is dropped and counted (the donor stays in the catalog, out of the pipeline: it is not found, never wrong).
A peer's add holds only the catalog's entry, whose vector is read when the add is applied: the catalog sizes
``max_pending`` to its capacity, so a late replica's whole sync queues and its search index ends with every donor.
Removals are never dropped: one is queued only for a donor the pipeline may hold once the queue is applied (a local add
of it queued, any peer's add queued, or in the pipeline; the catalog removes a donor once per time it added it), so
they are bounded by the donors the pipeline can hold and the catalog's removals while peers' adds wait. :meth:`close`
applies what is queued (within its timeout) and counts what is left.

While a late replica's sync adds its peers' donors the router *holds* the thread (:meth:`PipelineIndexer.hold`): it
takes no batch, so the catalog converges first, then indexes what was queued. The two side by side slowed each other:
usearch's add takes the GIL again between items, and the sync's adds run Python on the event loop.

A late replica whose pipeline is empty can instead load a peer's saved search index (:meth:`PipelineIndexer.
load_snapshot`, ahead of the held adds): an HNSW insert costs ~0.5 ms of a core, loading a saved graph ~1 µs a donor.
The sync's adds then skip each loaded donor the index holds with their vector, insert the others, and
:meth:`PipelineIndexer.prune` removes the loaded donors no add confirmed (gone from the peer since it saved them).

Memory: a bulk of changes (a late replica's sync, a burst of registrations) leaves freed heap that glibc keeps (at
1M donors ~470 B a donor of a replica's RSS, docs/benchmarks.md); once the queue is empty after ``TRIM_AFTER``
applied changes, and ``QUIET_TRIM_S`` after the last changes whatever their number, the thread hands it back to the
OS (``malloc_trim``; nothing where the C library is not glibc).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..index_snapshot import SnapshotError, file_digest
from ..namespace import NamespaceKey
from ..pipeline import DonorDiscovery
from .heap import trim_heap

log = logging.getLogger(__name__)

MAX_PENDING = 65_536
"""Queued adds at most by default (the catalog allows twice its capacity: a peer's add is a reference to its entry)."""
MAX_LOCAL = 4096
"""Queued adds carrying a prompt's tokens at most (an 8K-token prompt's list holds ~300 KB)."""
BATCH = 2048
"""Changes taken per turn; peers' embeddings of one namespace among them are inserted in one batch (usearch adds a
batch on every core: 2,048 took a late replica's 300K donors 28% faster than 256 on a 16-core host)."""
MAX_DEFER_S = 0.005
"""Longest a background step waits for the loop to finish deciding requests (so it cannot starve under load)."""
TRIM_AFTER = 10_000
"""Changes applied before the heap is trimmed, the next time the queue is empty."""
QUIET_TRIM_S = 1.0
"""Once no change has come for this long since changes were applied (fewer than ``TRIM_AFTER`` since the last trim:
a bulk's last ones), the heap is trimmed all the same."""
MAX_HOLD_S = 30.0
"""Longest the indexer stays held by one :meth:`PipelineIndexer.hold` (a sync that never ends cannot starve it)."""


class RequestGate:
    """Background donor work waits here, one step at a time, while the event loop decides a request and writes its
    hint.

    A thread running Python code holds the GIL; every time the loop thread lets the GIL go (a numpy call, a lock)
    it waits for it again, up to the switch interval each time. So the indexer and the donor thread start no new
    step while a request is being decided, for at most ``max_wait_s`` (then they go on, so a saturated loop still
    gets its donors indexed). ``deciding`` is entered and left on the loop thread only.
    """

    def __init__(self, max_wait_s: float = MAX_DEFER_S) -> None:
        self.max_wait_s = max_wait_s
        self._deciding = 0
        self._idle = threading.Event()
        self._idle.set()
        self._stepping: set[int] = set()

    @contextlib.contextmanager
    def deciding(self) -> Iterator[None]:
        self._deciding += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._deciding -= 1
            if not self._deciding:
                self._idle.set()

    @property
    def busy(self) -> bool:
        """Whether a request is being decided (or its hint written) now."""
        return self._deciding > 0

    def wait(self) -> None:
        """Called by a background thread before each step; it counts as stepping until :meth:`rest`."""
        self._idle.wait(self.max_wait_s)
        self._stepping.add(threading.get_ident())

    def rest(self) -> None:
        """Called by a background thread when its steps are done, before it waits for more work."""
        self._stepping.discard(threading.get_ident())

    def stepping(self) -> bool:
        """Whether a background thread is inside a step now: it takes the GIL whenever the loop lets it go, and the
        loop then waits for it again, up to the switch interval."""
        return bool(self._stepping)


@dataclass(frozen=True, slots=True)
class _Local:
    """A prompt registered here: spans from its tokens, its embedding (if any) indexed as is."""

    donor_id: str
    namespace: NamespaceKey
    tokens: Sequence[int]
    vector: np.ndarray | None
    owner: object = None


class PeerDonor(Protocol):
    """A peer's donor as the catalog keeps it: indexed by its embedding only."""

    @property
    def donor_id(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    def vector(self) -> np.ndarray:
        """The embedding as float32 (read on the indexer thread when the add is applied)."""
        ...

    @property
    def own_embedding(self) -> bytes | None:
        """The embedding as kept: int8 codes where the index stores codes, else float16 (None: not kept)."""
        ...


@dataclass(frozen=True, slots=True)
class _Remove:
    donor_id: str


@dataclass(frozen=True, slots=True)
class _Load:
    """A peer's saved search index to load into the empty pipeline, ahead of every queued add."""

    path: str
    digest: str
    done: Callable[[int, str], None]


@dataclass(frozen=True, slots=True)
class _Prune:
    """Every loaded donor no add has confirmed since leaves the pipeline."""


_Change = _Local | _Remove | _Load | _Prune | PeerDonor


class PipelineIndexer:
    """The one writer of a :class:`DonorDiscovery`'s donors once the router runs; see the module docstring.

    ``add_local``/``add_peers``/``remove`` never block on the pipeline: callers hold the catalog's lock.
    """

    def __init__(
        self,
        discovery: DonorDiscovery,
        on_evicted: Callable[[list[str]], None],
        on_indexed: Callable[[list[object]], None] | None = None,
        *,
        max_pending: int = MAX_PENDING,
        max_local: int = MAX_LOCAL,
    ) -> None:
        self.discovery = discovery
        self._on_evicted = on_evicted
        self._on_indexed = on_indexed
        self.max_pending = max_pending
        self.max_local = max_local
        self.counters: Counter[str] = Counter()
        """``dropped:<kind>:<reason>`` per change not applied, ``applied``, ``errors``, ``evicted``, ``heap_trims``."""
        self.on_dropped: Callable[[str, str], None] | None = None
        """Told ``(kind, reason)`` of each change dropped (the router's metric)."""
        self.gate: RequestGate | None = None
        """Waited at before each change (the router's: no indexing while it decides a request)."""
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Change] = deque()
        self._adds = 0
        self._locals = 0
        self._pending: dict[str, int] = {}  # donors with local adds queued or being applied: how many
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._since_trim = 0  # changes applied since the heap was last trimmed
        self._applied_at = 0.0  # when the last batch was applied (monotonic)
        self._held_until = 0.0
        self._unconfirmed: set[str] = set()  # loaded from a snapshot, no add or removal applied since (this thread's)

    # --- called by the catalog (its lock held): never waits for the pipeline -----------------------
    def add_local(
        self,
        donor_id: str,
        namespace: NamespaceKey,
        tokens: Sequence[int],
        vector: np.ndarray | None,
        owner: object = None,
    ) -> None:
        """``owner`` (if any) goes back through ``on_indexed`` once the add is applied."""
        with self._cond:
            self._add_locked(_Local(donor_id, namespace, tokens, vector, owner))
            self._wake()

    def add_peers(self, donors: Iterable[PeerDonor]) -> None:
        """Queues each donor itself, no copy of its vector (one hold of the lock and one wake-up of the thread for
        all); each goes back through ``on_indexed`` once applied."""
        donors = list(donors)
        with self._cond:
            if self._closed or self._adds + len(donors) > self.max_pending:
                for donor in donors:  # one by one: those past the bound are dropped, counted
                    self._add_locked(donor)
            else:  # as _add_locked, for all at once
                self._adds += len(donors)
                self._queue.extend(donors)
            self._wake()

    def remove(self, donor_id: str) -> None:
        with self._cond:
            if not self._known_locked(donor_id):
                return  # neither queued for the pipeline nor in it: nothing there to remove
            if self._closed:
                self._dropped("remove", "closed")
                return
            self._queue.append(_Remove(donor_id))
            self._wake()

    def _add_locked(self, change: _Local | PeerDonor) -> None:
        local = isinstance(change, _Local)
        reason = None
        if self._closed:
            reason = "closed"
        elif self._adds >= self.max_pending or (local and self._locals >= self.max_local):
            reason = "queue_full"
        if reason is not None:
            self._dropped("local" if local else "peer", reason)
            if not self._closed and self._known_locked(change.donor_id):  # an older copy must not stay behind
                self._queue.append(_Remove(change.donor_id))
            return
        if local:
            self._pending[change.donor_id] = self._pending.get(change.donor_id, 0) + 1
        self._adds += 1
        self._locals += local
        self._queue.append(change)

    def _known_locked(self, donor_id: str) -> bool:
        """Whether the pipeline may hold the donor once the queue is applied: a local add of it is queued or being
        applied (counted until applied), a peer's add is (any: a late replica's sync queues a million, and counting
        each took ~1 µs a donor of its CPU), or it is in the pipeline. (A set of every donor ever fed took ~40 B a
        donor.)"""
        return donor_id in self._pending or self._adds > self._locals or donor_id in self.discovery

    def _dropped(self, kind: str, reason: str) -> None:
        self.counters[f"dropped:{kind}:{reason}"] += 1
        if self.on_dropped is not None:
            self.on_dropped(kind, reason)

    def _wake(self) -> None:
        """The lock held: start the thread if it is not running and tell it there is work."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="semblend-indexer", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def hold(self, held: bool) -> None:
        """Held (a late replica's sync adding its peers' donors), the thread takes no new batch, for at most
        :data:`MAX_HOLD_S`: the catalog converges first, undisturbed, and what it queued meanwhile is indexed after.
        Changes are still queued; :meth:`drain` waits through a hold, :meth:`close` does not."""
        with self._cond:
            self._held_until = time.monotonic() + MAX_HOLD_S if held else 0.0
            self._cond.notify_all()

    def load_snapshot(self, path: str, digest: str, done: Callable[[int, str], None]) -> None:
        """Load a peer's saved search index (xxh3-128 ``digest``) before any queued change, held or not.

        Called once a late replica's sync has queued its adds, while its pipeline is empty (the loaded index then keeps
        the queued adds' id strings, the catalog's, instead of the file's copies). ``done(donors, reason)`` is called
        on the indexer thread: the donors loaded and ``"loaded"``, or 0 and why not (the sync's adds then index
        every donor). The adds that follow skip a loaded donor the index holds with their vector; :meth:`prune`,
        once the sync has queued them all, removes the loaded donors none of them confirmed.
        """
        with self._cond:
            if self._closed:
                done(0, "closed")
                return
            self._queue.appendleft(_Load(path, digest, done))
            self._wake()

    def prune(self) -> None:
        """Queue the end of a loaded snapshot: its donors no add confirmed leave (after every change queued before)."""
        with self._cond:
            if not self._closed:
                self._queue.append(_Prune())
                self._wake()

    @property
    def trim_pending(self) -> bool:
        """Whether changes were applied since the heap was last trimmed (it is, ``QUIET_TRIM_S`` after they stop)."""
        with self._cond:
            return self._since_trim > 0

    @property
    def held(self) -> bool:
        with self._cond:
            return self._held_until > time.monotonic()

    # --- waiting and stopping ------------------------------------------------------------------------
    @property
    def backlog(self) -> int:
        """Changes queued or being applied."""
        with self._cond:
            return len(self._queue) + self._busy

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every change queued so far is applied; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float = 5.0) -> None:
        """Apply what is queued (for at most ``timeout`` s), then stop; changes left over are counted dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            for change in self._queue:
                if isinstance(change, _Load):
                    change.done(0, "closed")
                elif not isinstance(change, _Prune):
                    self._dropped(_kind(change), "closed")
            if self._queue:
                log.warning("pipeline indexer stopped with %d changes not applied", len(self._queue))
            self._queue.clear()
            self._cond.notify_all()

    # --- the indexer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                quiet = False
                while not self._closed:
                    held = self._held_until - time.monotonic()
                    if self._queue and (held <= 0 or isinstance(self._queue[0], _Load)):
                        break
                    wait = held if self._queue else None
                    if not self._queue and self._since_trim:
                        wait = self._applied_at + QUIET_TRIM_S - time.monotonic()
                        if wait <= 0:
                            quiet = True
                            break
                    self._cond.wait(wait)
                if not quiet and not self._queue:
                    return
                if quiet:
                    batch = []
                elif isinstance(self._queue[0], _Load):
                    batch = [self._queue.popleft()]
                else:
                    batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                self._busy = True
            if quiet:  # the last changes' freed heap, handed back once they stopped
                self.counters["heap_trims"] += trim_heap()
                with self._cond:
                    self._since_trim = 0
                    self._busy = False
                    self._cond.notify_all()
                continue
            evicted: list[str] = []
            try:
                self._apply(batch, evicted)
            except Exception:  # a bug must not stop the feed: counted, logged, the next changes still applied
                self.counters["errors"] += 1
                log.exception("pipeline indexer: applying %d changes failed", len(batch))
            finally:
                if self.gate is not None:
                    self.gate.rest()
            if evicted:
                self.counters["evicted"] += len(evicted)
                try:
                    self._on_evicted(evicted)
                except Exception:
                    self.counters["errors"] += 1
                    log.exception("pipeline indexer: reporting %d evictions failed", len(evicted))
            owners = [owner for c in batch if (owner := _owner(c)) is not None]
            if owners and self._on_indexed is not None:
                try:
                    self._on_indexed(owners)
                except Exception:
                    self.counters["errors"] += 1
                    log.exception("pipeline indexer: reporting %d indexed donors failed", len(owners))
            self._since_trim += len(batch)
            if self._since_trim >= TRIM_AFTER and not self._queue:  # still busy: drain() waits for the trim
                self._since_trim = 0
                self.counters["heap_trims"] += trim_heap()
            with self._cond:
                for change in batch:
                    if isinstance(change, _Local):
                        self._locals -= 1
                        left = self._pending.pop(change.donor_id) - 1
                        if left:
                            self._pending[change.donor_id] = left
                    if not isinstance(change, _Remove | _Load | _Prune):
                        self._adds -= 1
                self._applied_at = time.monotonic()
                self._busy = False
                self._cond.notify_all()

    def _apply(self, batch: list[_Change], evicted: list[str]) -> None:
        """Apply in order; peers' donors with no other change between them go to the index in one batch each
        namespace (they are distinct donors, so their order among themselves does not matter)."""
        discovery = self.discovery
        peers: dict[str, dict[str, PeerDonor]] = {}
        waiting: set[str] = set()

        def flush() -> None:
            for namespace, donors in peers.items():
                self._defer()
                todo = self._unloaded(list(donors.values()), namespace) if self._unconfirmed else donors.values()
                if todo:
                    ids = [donor.donor_id for donor in todo]
                    rows = np.stack([donor.vector() for donor in todo])
                    evicted.extend(discovery.register_embeddings(ids, namespace, rows))
            peers.clear()
            waiting.clear()

        for change in batch:
            if isinstance(change, _Load | _Prune):
                flush()
                if isinstance(change, _Load):
                    self._load(change)
                else:
                    self._prune()
                continue
            if self._unconfirmed and isinstance(change, _Local | _Remove):
                self._unconfirmed.discard(change.donor_id)  # a local add or a removal: not the loaded copy
            if isinstance(change, _Local):
                flush()
                self._defer()
                evicted.extend(
                    discovery.register_donor(
                        change.donor_id,
                        change.namespace,
                        change.tokens,
                        embedding=change.vector,
                        before_commit=self._defer,
                    )
                )
            elif isinstance(change, _Remove):
                flush()
                self._defer()
                discovery.remove_donor(change.donor_id)
            else:
                if change.donor_id in waiting:
                    flush()
                peers.setdefault(change.namespace, {})[change.donor_id] = change
                waiting.add(change.donor_id)
        flush()
        self.counters["applied"] += len(batch)

    def _unloaded(self, donors: list[PeerDonor], namespace: str) -> list[PeerDonor]:
        """Peers' adds less the loaded donors the index holds with their embeddings (confirmed: nothing to insert;
        compared as the catalog keeps them, no vector made)."""
        assert self.discovery.index is not None
        loaded = [donor for donor in donors if donor.donor_id in self._unconfirmed]
        if not loaded:
            return donors
        ids = [donor.donor_id for donor in loaded]
        self._unconfirmed.difference_update(ids)
        held = self.discovery.index.holds(ids, namespace, [donor.own_embedding for donor in loaded])
        confirmed = set(itertools.compress(ids, held))
        self.counters["snapshot_confirmed"] += len(confirmed)
        return [donor for donor in donors if donor.donor_id not in confirmed]

    def _load(self, load: _Load) -> None:
        donors, reason = 0, "loaded"
        try:
            if file_digest(load.path) != load.digest:
                raise SnapshotError("digest_mismatch")
            with self._cond:  # the queued adds' ids: the catalog's own strings, kept instead of the file's copies
                queued = list(self._queue)
            same = {change.donor_id: change.donor_id for change in queued if not isinstance(change, _Load | _Prune)}
            del queued
            ids = self.discovery.load_snapshot(load.path, same)
            del same
            self._unconfirmed = set(ids)
            donors = len(ids)
        except SnapshotError as exc:
            reason = exc.reason
            log.warning("peer's search index not loaded (%s); indexing the sync's donors one by one", exc)
        except OSError as exc:
            reason = "unreadable"
            log.warning("peer's search index not loaded (%s); indexing the sync's donors one by one", exc)
        except Exception:  # usearch refusing a graph: the sync's donors are indexed one by one all the same
            reason = "error"
            self.counters["errors"] += 1
            log.exception("peer's search index not loaded; indexing the sync's donors one by one")
        self.counters[f"snapshot:{reason}"] += 1
        load.done(donors, reason)

    def _prune(self) -> None:
        stale, self._unconfirmed = self._unconfirmed, set()
        for donor_id in stale:
            self.discovery.remove_donor(donor_id)
        self.counters["snapshot_pruned"] += len(stale)

    def _defer(self) -> None:
        if self.gate is not None:
            self.gate.wait()


def _owner(change: _Change) -> object:
    """What goes back through ``on_indexed`` once the change is applied: a peer itself, a local add's owner."""
    if isinstance(change, _Local):
        return change.owner
    return None if isinstance(change, _Remove | _Load | _Prune) else change


def _kind(change: _Change) -> str:
    return "local" if isinstance(change, _Local) else "remove" if isinstance(change, _Remove) else "peer"
