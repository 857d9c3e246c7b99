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
lock to report evictions).
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable

from ..events.schemas import DonorRegistration, KvEvent
from ..namespace import NamespaceKey
from ..pipeline import DonorDiscovery
from .indexer import PipelineIndexer
from .residency import DonorEntry, Residency, WorkerKey

PENDING_LOCAL_DONORS = 4096
"""Prompts registered here whose blocks have not shown up yet (their tokens wait for residency)."""


class DonorCatalog:
    """Owns every donor the router knows; see the module docstring."""

    def __init__(self, capacity: int, discovery: DonorDiscovery | None) -> None:
        self._lock = threading.RLock()
        self._residency = Residency(capacity)
        self.indexer = PipelineIndexer(discovery, self._pipeline_evicted) if discovery is not None else None
        self._local_tokens: OrderedDict[str, tuple[NamespaceKey, list[int]]] = OrderedDict()
        self._seq = 0
        self._seq_of: dict[str, int] = {}
        self._order: list[int] = []  # sequence numbers in add order (stale ones skipped, compacted when many)
        self._id_at: dict[int, str] = {}
        self.changed = True
        """Set on every change; the metrics scrape clears it after refreshing the donor gauges."""

    # --- writes ----------------------------------------------------------------------------------
    def add(self, registration: DonorRegistration, local: tuple[NamespaceKey, list[int]] | None = None) -> bool:
        """Add a registration (a peer's, a sync page's, or ``local`` with its prompt tokens for spans).

        An older copy of a known donor is ignored (returns False).
        """
        with self._lock:
            donor_id = registration.donor_id
            known = self._residency.donor(donor_id)
            if known is not None and known.registered_at >= registration.registered_at:
                return False
            if local is not None:
                self._local_tokens[donor_id] = local
                while len(self._local_tokens) > PENDING_LOCAL_DONORS:
                    self._local_tokens.popitem(last=False)
            for evicted in self._residency.add_donor(registration):
                self._forget_locked(evicted)
            self._sequence(donor_id)
            self._sync_pipeline()
            self.changed = True
            return True

    def add_many(self, registrations: Iterable[DonorRegistration]) -> int:
        """:meth:`add` for many peers' registrations (a sync page) under one lock, the pipeline fed in batches.

        Returns how many were added (older copies of known donors are ignored).
        """
        with self._lock:
            added = 0
            for registration in registrations:
                known = self._residency.donor(registration.donor_id)
                if known is not None and known.registered_at >= registration.registered_at:
                    continue
                for evicted in self._residency.add_donor(registration):
                    self._forget_locked(evicted)
                self._sequence(registration.donor_id)
                added += 1
            if added:
                self._sync_pipeline()
                self.changed = True
            return added

    def forget(self, donor_id: str) -> bool:
        """A donor is gone (evicted on its worker, reported gone by a connector). False if unknown."""
        with self._lock:
            known = donor_id in self._residency
            self._forget_locked(donor_id)
            self.changed = True
            return known

    def apply_kv_events(self, events: Iterable[KvEvent]) -> int:
        """Apply Dynamo kv-events in arrival order; returns the event-id gaps they revealed."""
        with self._lock:
            gaps = self._residency.event_gaps
            for event in events:
                self._residency.apply(event)
            self._sync_pipeline()
            return self._residency.event_gaps - gaps

    def reconcile(self, events: Iterable[KvEvent]) -> int:
        """Residency becomes exactly Dynamo's whole index (see :meth:`Residency.reconcile`); returns blocks changed."""
        with self._lock:
            changed = self._residency.reconcile(events)
            self._sync_pipeline()
            return changed

    def merge_dump(self, events: Iterable[KvEvent]) -> None:
        """Stored blocks recovered from Dynamo's index (see :meth:`Residency.merge_dump`)."""
        with self._lock:
            self._residency.merge_dump(events)
            self._sync_pipeline()

    def retain_workers(self, live_worker_ids: Collection[int]) -> list[str]:
        """Donors of departed workers leave; returns their ids."""
        with self._lock:
            removed = self._residency.retain_workers(set(live_worker_ids))
            for donor_id in removed:
                self._forget_locked(donor_id)
            if removed:
                self.changed = True
            return removed

    # --- reads -----------------------------------------------------------------------------------
    def resident_donor(self, donor_id: str) -> DonorEntry | None:
        """The donor if it is known and resident now."""
        with self._lock:
            entry = self._residency.donor(donor_id)
            return entry if entry is not None and self._residency.is_resident(donor_id) else None

    def is_resident(self, donor_id: str) -> bool:
        with self._lock:
            return self._residency.is_resident(donor_id)

    def page(
        self,
        after: int,
        limit: int,
        *,
        upto: int | None = None,
        fits: Callable[[DonorEntry], bool] | None = None,
    ) -> tuple[list[tuple[int, DonorEntry]], bool]:
        """Up to ``limit`` ``(cursor, donor)`` pairs with cursors in ``(after, upto]`` (0: from the start).

        The cursor is the catalog's add sequence, so paging never repeats or skips a donor that stayed known.
        ``fits`` is asked about each donor in turn; the page ends before the first it refuses (a first donor it
        refuses goes alone). The flag says whether more follow in the range.
        """
        with self._lock:
            out: list[tuple[int, DonorEntry]] = []
            order = self._order
            for i in range(bisect.bisect_right(order, after), len(order)):
                seq = order[i]
                if upto is not None and seq > upto:
                    break
                donor_id = self._id_at.get(seq)
                entry = None if donor_id is None else self._residency.donor(donor_id)
                if entry is None:
                    continue
                if len(out) == limit:
                    return out, True
                if fits is not None and not fits(entry):
                    if out:
                        return out, True
                    limit = 1  # too large for any page: it goes alone
                out.append((seq, entry))
            return out, False

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
        """A copy of the donor ids resident in ``namespace``."""
        with self._lock:
            return set(self._residency.resident(namespace))

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
        with self._lock:
            for donor_id in donor_ids:
                if donor_id in self._residency:
                    self._forget_locked(donor_id)
            self.changed = True

    # --- internals (lock held) -------------------------------------------------------------------
    def _sequence(self, donor_id: str) -> None:
        old = self._seq_of.pop(donor_id, None)
        if old is not None:
            self._id_at.pop(old, None)
        self._seq += 1
        self._seq_of[donor_id] = self._seq
        self._id_at[self._seq] = donor_id
        self._order.append(self._seq)
        if len(self._order) > 2 * len(self._id_at) + 1024:
            self._order = [s for s in self._order if s in self._id_at]

    def _forget_locked(self, donor_id: str) -> None:
        self._residency.remove_donor(donor_id)
        self._local_tokens.pop(donor_id, None)
        seq = self._seq_of.pop(donor_id, None)
        if seq is not None:
            self._id_at.pop(seq, None)
        if self.indexer is not None:
            self.indexer.remove(donor_id)

    def _sync_pipeline(self) -> None:
        """Keep the pipeline's donors equal to the resident ones (peers' embeddings indexed in batches)."""
        changes = self._residency.take_changes()
        if not changes:
            return
        self.changed = True
        left = {donor_id for donor_id, resident in changes if not resident}
        for donor_id in left:  # its KV is partly gone: a peer's copy would have to be re-registered anyway
            if self._residency.donor(donor_id) is not None:
                self._forget_locked(donor_id)
        if self.indexer is None:
            return
        index = self.indexer.discovery.index
        for donor_id in dict.fromkeys(d for d, resident in changes if resident and d not in left):
            entry = self._residency.donor(donor_id)
            if entry is None:
                continue
            local = self._local_tokens.pop(donor_id, None)
            if local is not None:  # registered here: spans from its tokens, the embedding already computed
                vector = entry.vector() if entry.embedding_dim else None
                self.indexer.add_local(donor_id, local[0], local[1], vector)
            elif index is not None and entry.embedding_dim == index.dim:
                self.indexer.add_peer(donor_id, entry.namespace, entry.vector())
