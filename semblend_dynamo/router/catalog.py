"""The router's donor state behind one object: the catalog, residency and the pipeline's donors, one lock.

:class:`DonorCatalog` is the only writer of the router's donor set. It keeps three things equal:

* the catalog of :class:`DonorRegistration` (local and peers'), with its resident sets (:class:`Residency`);
* the discovery pipeline's donors (spans and embedding index): exactly the resident ones, added on arrival and
  dropped on eviction. The catalog decides those changes and queues them, in that order, to its
  :class:`~semblend_dynamo.router.indexer.PipelineIndexer`, whose thread applies them through
  :class:`~semblend_dynamo.pipeline.DonorDiscovery`'s own methods: the pipeline follows a moment later
  (:meth:`DonorCatalog.drain` waits for it), and the catalog's own state never waits for it;
* the sync cursor order (:meth:`page`): registrations in the order they were last added.

Every method takes the catalog's lock, so the event loop, registration threads and the metrics scrape may call
it concurrently. Nothing here awaits, and nothing under the lock calls the pipeline (the indexer thread takes this
lock to report evictions). Two exceptions, both read on the event loop for a request: :meth:`resident_donor` (every
placement) does not wait while another thread adds a registration of another donor, and :meth:`stored_together` (the
exact-wins gate) does not wait for the lock at all; see there. Nor does :meth:`apply_kv_events` (the loop's kv-events):
a batch that finds the lock held is queued and applied, in order, by the loop's next try or the next write.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
from array import array
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress
from operator import attrgetter, not_

from ..donor_index import VectorDtype
from ..events.schemas import DonorRegistration, KvEvent, SyncColumns, SyncRows
from ..namespace import NamespaceKey
from ..pipeline import DonorDiscovery
from .indexer import MAX_PENDING, PipelineIndexer
from .residency import (
    DonorEntry,
    Residency,
    WorkerKey,
    embedding_dims,
    held_embeddings,
    sync_columns,
    sync_row_bytes,
)

_BLOB, _MISSING = attrgetter("blob"), attrgetter("missing")

PENDING_LOCAL_DONORS = 4096
"""Prompts registered here whose blocks have not shown up yet (their tokens wait for residency)."""

log = logging.getLogger(__name__)


READ_BACK = 256
"""Entries of a sync page whose embeddings are read back from the search index in one call (a page of 1 MiB holds
~1,700 donors of 384 dims: a larger batch reads back more than the page takes)."""


@dataclass(slots=True)
class CatalogPage:
    """Donors of the catalog in cursor order (:meth:`DonorCatalog.page`), each with its embedding: ``embeddings[i]``
    read back from the search index for entry ``i``, or None where the entry holds its own."""

    cursors: list[int]
    entries: list[DonorEntry]
    blobs: list[bytes]
    """Each entry's blob as it was under the catalog's lock (the indexer's thread may drop an embedding since)."""
    embeddings: list[bytes | None]
    more: bool
    """Whether the requested range holds more donors after these."""

    def __len__(self) -> int:
        return len(self.entries)

    def columns(self, count: int | None = None) -> SyncColumns:
        """The first ``count`` donors (all by default) as a sync page's columns."""
        return sync_columns(self.entries[:count], self.blobs[:count], self.embeddings[:count])


class DonorCatalog:
    """Owns every donor the router knows; see the module docstring."""

    def __init__(self, capacity: int, discovery: DonorDiscovery | None, *, index_dtype: VectorDtype = "f16") -> None:
        """``index_dtype``: the configured search index's storage (``SEMBLEND_INDEX_DTYPE``). Donors keep their
        embeddings as the int8 codes the index stores when it stores codes (the pipeline's index if there is one, else
        ``index_dtype``: what the peers' indexes take), else as float16 (:mod:`semblend_dynamo.vector_codes`)."""
        self._lock = threading.RLock()
        # kv-event batches that found the lock held by another thread, in arrival order (see apply_kv_events)
        self._kv_queue: deque[list[KvEvent]] = deque()
        self._gaps_told = 0  # event-id gaps apply_kv_events and flush_kv_events have returned
        self.kv_errors = 0
        """Queued kv-event batches that failed to apply (logged; a batch applied at once raises to its caller)."""
        # Read without the lock by resident_donor (see there): the write in progress may change these donors' entries
        # (None: any donor's), and how many writes have started.
        self._changing: frozenset[str] | None = frozenset()
        self._writes = 0
        self.gate_unsure = 0
        """Exact-wins gates answered None (not known) because a block map they read was changing on another thread."""
        index = None if discovery is None else discovery.index
        self._residency = Residency(capacity, codes=index.stores_codes if index is not None else index_dtype == "i8")
        # A peer's queued add costs a reference to its entry: room for two full catalogs (a late replica's sync, and
        # the donors replaced while it is indexed) before an add is dropped.
        self.indexer = (
            PipelineIndexer(
                discovery,
                self._pipeline_evicted,
                self._pipeline_indexed,
                max_pending=max(MAX_PENDING, 2 * capacity),
            )
            if discovery is not None
            else None
        )
        self._local_tokens: OrderedDict[str, tuple[NamespaceKey, list[int]]] = OrderedDict()
        self._seq = 0
        # Cursors in add order with the entry each was given to; an entry no longer the catalog's (replaced or
        # forgotten) is skipped, and dropped when they are many. 16 bytes a donor, no per-donor objects.
        self._order = array("q")
        self._order_entries: list[DonorEntry] = []
        self.changed = True
        """Set on every change; the metrics scrape clears it after refreshing the donor gauges."""

    # --- writes ----------------------------------------------------------------------------------
    def add(self, registration: DonorRegistration, local: tuple[NamespaceKey, list[int]] | None = None) -> bool:
        """Add a registration (a peer's, a sync page's, or ``local`` with its prompt tokens for spans).

        An older copy of a known donor is ignored (returns False). Queued kv-event batches are left queued (an add and
        a kv-event end the same in either order; the donor thread's hold stays as short as its own work).
        """
        with self._writing(frozenset((registration.donor_id,)), kv_queue=False):
            donor_id = registration.donor_id
            known = self._residency.donor(donor_id)
            if known is not None and known.registered_at >= registration.registered_at:
                return False
            if local is not None:
                self._local_tokens[donor_id] = local
                while len(self._local_tokens) > PENDING_LOCAL_DONORS:
                    self._local_tokens.popitem(last=False)
            self._add_locked([(donor_id, registration.registered_at)], self._residency.add_many([registration]))
            return True

    def add_many(self, registrations: Iterable[DonorRegistration]) -> int:
        """:meth:`add` for many peers' registrations (a sync page) under one lock: residency takes them in one
        batch and the pipeline is fed in batches.

        Returns how many were added (older copies of known donors are ignored, and so is the older of two copies
        in ``registrations``).
        """
        with self._writing():
            regs = list(registrations)
            fresh = [regs[i] for i in self._fresh((r.donor_id, r.registered_at) for r in regs)]
            if fresh:
                self._add_locked([(r.donor_id, r.registered_at) for r in fresh], self._residency.add_many(fresh))
            return len(fresh)

    def add_rows(self, parts: Sequence[tuple[SyncRows, Sequence[int]]], *, skip_router: str | None = None) -> int:
        """:meth:`add_many` for rows of sync pages, from their columns: each part is a page's rows and the rows of it
        to add (in this order); rows registered by router ``skip_router`` (if given) are left out. Returns how many
        were added."""
        pick = SyncRows.pick
        with self._writing():
            kept = [
                (
                    rows,
                    picked
                    if skip_router is None or skip_router not in rows.router_ids
                    else _not_of(rows, picked, skip_router),
                )
                for rows, picked in parts
            ]
            ids = list(chain.from_iterable(pick(rows.donor_ids, picked) for rows, picked in kept))
            new = len(set(ids)) == len(ids) and not self._residency.knows_any(ids)
            if not new:  # known donors or repeats: only copies newer than what is known
                stamps = list(chain.from_iterable(pick(rows.registered_at, picked) for rows, picked in kept))
                fresh = set(self._fresh(zip(ids, stamps, strict=True)))
                position = iter(range(len(ids)))
                kept = [(rows, [i for i in picked if next(position) in fresh]) for rows, picked in kept]
                ids = [donor_id for j, donor_id in enumerate(ids) if j in fresh]
                if ids:
                    _, evicted = self._residency.add_rows(kept)
                    stamps = [at for j, at in enumerate(stamps) if j in fresh]
                    self._add_locked(list(zip(ids, stamps, strict=True)), evicted)
            elif ids:
                taken, evicted = self._residency.add_rows(kept, new=True, ids=ids)
                # the stamps are read only when the add evicted (else each taken entry gets its cursor in order)
                added = (
                    list(
                        zip(
                            ids,
                            chain.from_iterable(pick(rows.registered_at, picked) for rows, picked in kept),
                            strict=True,
                        )
                    )
                    if evicted
                    else []
                )
                self._add_locked(added, evicted, taken, dim=_one_dim([rows for rows, _ in kept]))
            return len(ids)

    def forget(self, donor_id: str) -> bool:
        """A donor is gone (evicted on its worker, reported gone by a connector). False if unknown."""
        with self._writing():
            known = donor_id in self._residency
            self._forget_locked(donor_id)
            self.changed = True
            return known

    def apply_kv_events(self, events: Iterable[KvEvent]) -> int:
        """Apply Dynamo kv-events in arrival order; returns the event-id gaps revealed since the last report.

        Never waits for the lock (the event loop calls it): while another thread holds it (the donor thread adding a
        registration), the batch is queued (:attr:`kv_queued`) and applied, after those queued before it, by the next
        :meth:`apply_kv_events` or :meth:`flush_kv_events` that finds the lock free, or by the next write other than a
        registration's add (which then comes after them). Its gaps are reported by the call that applies it.
        """
        batch = list(events)
        if not self._lock.acquire(blocking=False):
            self._kv_queue.append(batch)
            return 0
        try:
            with self._writing():  # the batches queued before this one are applied first (by _writing)
                for event in batch:
                    self._residency.apply(event)
                self._sync_pipeline()
        finally:
            self._lock.release()
        return self._new_gaps()

    def flush_kv_events(self) -> int:
        """Apply the queued kv-event batches if the lock is free (never waits); returns the event-id gaps revealed
        since the last report. The router calls it soon after a batch was queued."""
        if self._kv_queue and self._lock.acquire(blocking=False):
            try:
                with self._writing():
                    pass
            finally:
                self._lock.release()
        return self._new_gaps()

    def settle_maps(self, entries: int) -> tuple[int, int] | None:
        """Write up to ``entries`` of the block maps' base rewrites that changes left in progress
        (:meth:`Residency.settle`); ``(written, left)``, or None while another thread holds the lock (never waits: the
        event loop calls it). It changes no donor and no block, only how the maps hold them."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._residency.settle(entries)
        finally:
            self._lock.release()

    def maps_rewrite_left(self) -> int:
        """Entries the block maps' base rewrites in progress have still to write (a gauge's reading)."""
        with self._lock:
            return self._residency.rewrite_left()

    @property
    def kv_queued(self) -> bool:
        """Whether kv-event batches wait to be applied (see :meth:`apply_kv_events`)."""
        return bool(self._kv_queue)

    def _new_gaps(self) -> int:
        gaps = self._residency.event_gaps - self._gaps_told
        self._gaps_told += gaps
        return gaps

    def reconcile(self, events: Iterable[KvEvent]) -> int:
        """Residency becomes exactly Dynamo's whole index (see :meth:`Residency.reconcile`); returns blocks changed."""
        with self._writing():
            changed = self._residency.reconcile(events)
            self._sync_pipeline()
            return changed

    def merge_dump(self, events: Iterable[KvEvent]) -> None:
        """Stored blocks recovered from Dynamo's index (see :meth:`Residency.merge_dump`)."""
        with self._writing():
            self._residency.merge_dump(events)
            self._sync_pipeline()

    def retain_workers(self, live_worker_ids: Collection[int]) -> list[str]:
        """Donors of departed workers leave; returns their ids."""
        with self._writing():
            removed = self._residency.retain_workers(set(live_worker_ids))
            for donor_id in removed:
                self._forget_locked(donor_id)
            if removed:
                self.changed = True
            return removed

    # --- reads -----------------------------------------------------------------------------------
    def resident_donor(self, donor_id: str) -> DonorEntry | None:
        """The donor if it is known and resident now.

        While another thread holds the lock for a registration of another donor, this reads without waiting for it: an
        add changes only its own donor's entry and may drop others (capacity, blocks gone), so every other donor reads
        as before or after that add, as with the lock. The read is kept only if no other write started meanwhile
        (writes publish what they change before they change it); otherwise, and during any other write, it waits.
        """
        if not self._lock.acquire(blocking=False):
            writes, changing = self._writes, self._changing
            if changing is not None and donor_id not in changing:
                entry = self._residency.donor(donor_id)
                resident = entry is not None and entry.missing == 0
                if self._writes == writes:
                    return entry if resident else None
            self._lock.acquire()
        try:
            entry = self._residency.donor(donor_id)
            return entry if entry is not None and entry.missing == 0 else None
        finally:
            self._lock.release()

    def stored_together(self, tokens_hashes: Sequence[int]) -> bool | None:
        """Whether one worker rank stores blocks of all of ``tokens_hashes`` (see :meth:`Residency.stored_together`),
        or None when that cannot be read without waiting.

        The exact-wins gate on the request path: it never waits for the lock. While another thread holds it, the block
        maps are read without it (:meth:`Residency.read_stored_together`: each map tells whether a change overlapped
        the read); if one did (the donor thread posting a registration's hashes on that rank), the answer is None,
        counted in :attr:`gate_unsure`.
        """
        if self._lock.acquire(blocking=False):
            try:
                return self._residency.stored_together(tokens_hashes)
            finally:
                self._lock.release()
        stored = self._residency.read_stored_together(tokens_hashes)
        if stored is None:
            self.gate_unsure += 1
        return stored

    def is_resident(self, donor_id: str) -> bool:
        with self._lock:
            return self._residency.is_resident(donor_id)

    def page(self, after: int, limit: int, *, upto: int | None = None, max_bytes: int | None = None) -> CatalogPage:
        """Up to ``limit`` donors with cursors in ``(after, upto]`` (0: from the start), in cursor order, with their
        embeddings.

        The cursor is the catalog's add sequence, so paging never repeats or skips a donor that stayed known.
        ``max_bytes``: the page ends before the first donor that would take its rows past that many bytes
        (:func:`sync_row_bytes`; a first donor alone past it goes alone). A donor that dropped its embedding and is
        no longer in the search index is left out.
        """
        with self._lock:
            page = CatalogPage([], [], [], [], False)
            order, order_entries, current = self._order, self._order_entries, self._residency.current
            left = max_bytes
            i = bisect.bisect_right(order, after)
            end = len(order) if upto is None else bisect.bisect_right(order, upto)
            while True:
                # the next few current entries, their embeddings read back together and sized together
                want = min(READ_BACK, limit + 1 - len(page.entries))
                picked: list[tuple[int, DonorEntry]] = []
                while i < end and len(picked) < want:
                    j = min(end, i + want - len(picked))
                    ahead = order_entries[i:j]
                    picked += compress(zip(order[i:j], ahead, strict=True), current(ahead))
                    i = j
                if not picked:
                    return page
                embedded = self._with_embeddings(picked)
                take = min(limit - len(page.entries), len(embedded))
                if left is not None:
                    spent = list(accumulate(sync_row_bytes([entry for _, entry, _ in embedded[:take]])))
                    fits = bisect.bisect_right(spent, left)
                    if not fits and not page.entries and take:  # too large for any page: it goes alone
                        fits, limit = 1, 1
                    take = min(take, fits)
                    left -= spent[take - 1] if take else 0
                if take:
                    seqs, chosen, embeddings = zip(*embedded[:take], strict=True)
                    page.cursors += seqs
                    page.entries += chosen
                    page.blobs += map(_BLOB, chosen)
                    page.embeddings += embeddings
                if take < len(embedded):
                    page.more = True
                    return page

    def _with_embeddings(self, picked: list[tuple[int, DonorEntry]]) -> list[tuple[int, DonorEntry, bytes | None]]:
        """Each entry with the embedding the search index holds for it (None: it holds its own), read back in one call
        for all that dropped theirs (one by one, ~50 µs each, they made a peer serving a 1M-donor sync spend ~50 s of
        CPU); those the index no longer holds are left out."""
        index = None if self.indexer is None else self.indexer.discovery.index
        embedded = held_embeddings([entry for _, entry in picked])
        dropped = [entry.donor_id for (_, entry), kept in zip(picked, embedded, strict=True) if not kept]
        if not dropped or index is None:
            return [(seq, entry, None) for (seq, entry), kept in zip(picked, embedded, strict=True) if kept]
        stored = iter(index.stored_embeddings(dropped))
        out: list[tuple[int, DonorEntry, bytes | None]] = []
        for (seq, entry), kept in zip(picked, embedded, strict=True):
            if kept:
                out.append((seq, entry, None))
            elif (embedding := next(stored)) is not None:
                out.append((seq, entry, embedding))
        return out

    @property
    def last_cursor(self) -> int:
        """The newest cursor handed out."""
        return self._seq

    def __len__(self) -> int:
        with self._lock:
            return len(self._residency)

    def __contains__(self, donor_id: object) -> bool:
        with self._lock:
            return donor_id in self._residency

    @property
    def event_gaps(self) -> int:
        return self._residency.event_gaps

    def workers(self) -> list[WorkerKey]:
        with self._lock:
            return self._residency.workers()

    def donors_per_worker(self) -> dict[WorkerKey, tuple[int, int]]:
        with self._lock:
            return self._residency.donors_per_worker()

    def snapshot(self) -> list[dict[str, object]]:
        with self._lock:
            return self._residency.snapshot()

    def resident(self, namespace: str) -> set[str]:
        """The donor ids resident in ``namespace`` (a scan of every donor: for debugging and tests)."""
        with self._lock:
            return self._residency.resident(namespace)

    def resident_count(self, namespace: str) -> int:
        with self._lock:
            return self._residency.resident_count(namespace)

    # --- the pipeline feed -----------------------------------------------------------------------
    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the pipeline holds every change decided so far (tests, benchmarks); False on timeout."""
        return self.indexer is None or self.indexer.drain(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Apply the queued pipeline changes (at most ``timeout`` s; the rest are counted) and stop the indexer."""
        if self.indexer is not None:
            self.indexer.close(timeout)

    def _pipeline_evicted(self, donor_ids: list[str]) -> None:
        """The pipeline's index pushed these out for capacity (indexer thread): they leave the catalog too."""
        with self._writing():
            for donor_id in donor_ids:
                if donor_id in self._residency:
                    self._forget_locked(donor_id)
            self.changed = True

    # --- internals (lock held) -------------------------------------------------------------------
    def _apply_queued(self) -> None:
        """Apply the kv-event batches queued while another thread held the lock, in arrival order (inside a write that
        published it may change any donor); a batch that fails is logged and counted (it was received earlier, by a
        call that returned)."""
        queued = self._kv_queue
        while queued:
            batch = queued.popleft()
            try:
                for event in batch:
                    self._residency.apply(event)
            except Exception:
                self.kv_errors += 1
                log.exception("a queued kv-event batch failed to apply")
        self._sync_pipeline()

    @contextlib.contextmanager
    def _writing(self, donor_ids: frozenset[str] | None = None, *, kv_queue: bool = True) -> Iterator[None]:
        """The lock, for a write that may change the entries of ``donor_ids`` (None: of any donor) and drop others;
        published before it changes anything, for :meth:`resident_donor`. ``kv_queue``: the queued kv-event batches
        are applied first (then it may change any donor's entry)."""
        with self._lock:
            before = self._changing
            queued = kv_queue and bool(self._kv_queue)
            self._changing = None if before is None or donor_ids is None or queued else before | donor_ids
            self._writes += 1
            try:
                if queued:
                    self._apply_queued()
                yield
            finally:
                self._changing = before

    def _fresh(self, donors: Iterable[tuple[str, float]]) -> list[int]:
        """The positions of the ``(donor_id, registered_at)`` pairs newer than what is known of their donors (the
        catalog's copy, or an earlier pair of the same donor)."""
        picked: list[int] = []
        newest: dict[str, float] = {}
        for i, (donor_id, registered_at) in enumerate(donors):
            at = newest.get(donor_id)
            if at is None and (known := self._residency.donor(donor_id)) is not None:
                at = known.registered_at
            if at is not None and at >= registered_at:
                continue
            newest[donor_id] = registered_at
            picked.append(i)
        return picked

    def _add_locked(
        self,
        added: list[tuple[str, float]],
        evicted: list[str],
        taken: list[DonorEntry] | None = None,
        *,
        dim: int | None = None,
    ) -> None:
        """Residency took the ``(donor_id, registered_at)`` pairs ``added`` and pushed out ``evicted``: each pair gets
        the next cursor, which stays the donor's unless it was evicted or replaced later in the batch; then the
        pipeline follows. ``taken``: the entries residency took for ``added``, in order, when no donor repeats;
        ``dim``: (with ``taken``) the embedding dimension of every one of them, if known."""
        for donor_id in evicted:
            self._forget_locked(donor_id)
        if not evicted and taken is not None:
            self._order.extend(range(self._seq + 1, self._seq + len(taken) + 1))
            self._order_entries += taken
            self._seq += len(taken)
        elif not evicted and len(ids := [donor_id for donor_id, _ in added]) == len(set(ids)):
            # each donor's entry is the one residency just took
            self._order.extend(range(self._seq + 1, self._seq + len(ids) + 1))
            self._order_entries += self._residency.entries(ids)
            self._seq += len(ids)
        else:
            for donor_id, registered_at in added:
                self._seq += 1
                entry = self._residency.donor(donor_id)
                if entry is not None and entry.registered_at == registered_at:
                    self._order.append(self._seq)
                    self._order_entries.append(entry)
        if len(self._order) > 2 * len(self._residency) + 1024:
            keep = list(compress(range(len(self._order_entries)), self._residency.current(self._order_entries)))
            self._order = array("q", (self._order[i] for i in keep))
            self._order_entries = [self._order_entries[i] for i in keep]
        self._sync_pipeline(taken if not evicted else None, dim)
        self.changed = True

    def _forget_locked(self, donor_id: str) -> None:
        self._residency.remove_donor(donor_id)
        self._local_tokens.pop(donor_id, None)
        if self.indexer is not None:
            self.indexer.remove(donor_id)

    def _sync_pipeline(self, taken: list[DonorEntry] | None = None, dim: int | None = None) -> None:
        """Keep the pipeline's donors equal to the resident ones (peers' embeddings indexed in batches). ``taken``: the
        batch only took these new entries (no donor replaced or removed), so the donors that arrived are those of them
        now resident: found without a look-up by id (a sync's usual add; ~0.3 µs a donor at 1M); ``dim``: the
        embedding dimension of every one of them, if known."""
        changes = self._residency.take_changes()
        if not changes:
            return
        self.changed = True
        if taken is not None and not self._local_tokens and self.indexer is not None:
            resident = list(compress(taken, map(not_, map(_MISSING, taken))))
            if len(resident) == len(changes):  # every change is the arrival of one of them
                self._index_peers(resident, dim)
                return
        left = {donor_id for donor_id, resident in changes if not resident}
        for donor_id in left:  # its KV is partly gone: a peer's copy would have to be re-registered anyway
            if self._residency.donor(donor_id) is not None:
                self._forget_locked(donor_id)
        if self.indexer is None:
            return
        arrived = [donor_id for donor_id, resident in changes if resident]
        if left:
            arrived = [donor_id for donor_id in arrived if donor_id not in left]
        arrived = list(dict.fromkeys(arrived))
        # distinct donors: peers queued together after the locals, one wake-up of the indexer
        peers = [entry for entry in self._residency.donors_of(arrived) if entry is not None]
        if self._local_tokens:
            held, peers = peers, []
            for entry in held:
                local = self._local_tokens.pop(entry.donor_id, None)
                if local is None:
                    peers.append(entry)
                else:  # registered here: spans from its tokens, the embedding already computed
                    vector = entry.vector() if entry.embedding_dim else None
                    self.indexer.add_local(entry.donor_id, local[0], local[1], vector, owner=entry)
        self._index_peers(peers)

    def _index_peers(self, peers: list[DonorEntry], dim: int | None = None) -> None:
        """Queue resident peers' donors for the search index (those with an embedding of its dimension; ``dim``: the
        dimension of every one of them, if known)."""
        index = None if self.indexer is None else self.indexer.discovery.index
        if self.indexer is None or index is None or not peers:
            return
        if dim is None:
            peers = list(compress(peers, (embedding_dims(peers) == index.dim).tolist()))
        elif dim != index.dim:
            return
        self.indexer.add_peers(peers)

    def _pipeline_indexed(self, entries: list[object]) -> None:
        """The pipeline indexed these entries' donors (indexer thread): an entry still the catalog's keeps no copy of
        its vector once the search index holds it (768 bytes a donor at 384 dims; :meth:`_current` reads it back)."""
        index = None if self.indexer is None else self.indexer.discovery.index
        if index is None:
            return
        with self._lock:
            for entry in entries:
                if (
                    isinstance(entry, DonorEntry)
                    and self._residency.donor(entry.donor_id) is entry
                    and entry.donor_id in index
                ):
                    entry.drop_embedding()


def _one_dim(pages: Sequence[SyncRows]) -> int | None:
    """The embedding dimension of every row of these pages, if they have one (then it need not be read from each
    donor's blob)."""
    dims = {rows.embedding_dims[0] for rows in pages if len(rows)}
    if len(dims) != 1:
        return None
    dim = dims.pop()
    return dim if all(rows.embedding_dims.count(dim) == len(rows) for rows in pages) else None


def _not_of(rows: SyncRows, picked: Sequence[int], router_id: str) -> list[int]:
    """Rows ``picked`` but those registered by ``router_id``."""
    return [i for i in picked if rows.router_ids[i] != router_id]
