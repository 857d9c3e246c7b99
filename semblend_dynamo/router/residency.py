"""Which donors are resident where, followed through Dynamo's exact ``kv-events``.

A donor is a finished prompt on the worker that served it, known by its Dynamo block content hashes
(``tokens_hash``, seeded with LoRA and cache salt exactly as ``compute_block_hash_for_seq`` does). It is
*resident* only while every one of those hashes is stored on that worker's device tier (per
``(worker_id, dp_rank)``) and the worker is live. ``removed``/``cleared`` events and worker departure take
donors out; re-stored blocks bring them back. Every replica fed the same events and registrations holds
the same catalog and the same resident sets.

Not thread-safe: the router mutates and reads it from its event loop only.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import numpy as np

from ..events.schemas import DonorRegistration, KvCleared, KvEvent, KvRemoved, KvStored

WorkerKey = tuple[int, int]
"""``(worker_id, dp_rank)``, Dynamo's ``WorkerWithDpRank``."""

DEVICE_TIER = "device"

Posting = str | set[str]
"""The donors using one block hash: most hashes have one, kept as its bare id (a one-element set costs 216 bytes,
16 per donor: the larger part of a replica's memory per donor before)."""


def _posting_ids(posting: Posting) -> Collection[str]:
    return (posting,) if isinstance(posting, str) else posting


def _posting_add(postings: dict[int, Posting], tokens_hash: int, donor_id: str) -> None:
    held = postings.get(tokens_hash)
    if held is None:
        postings[tokens_hash] = donor_id
    elif isinstance(held, str):
        if held != donor_id:
            postings[tokens_hash] = {held, donor_id}
    else:
        held.add(donor_id)


def _posting_discard(postings: dict[int, Posting], tokens_hash: int, donor_id: str) -> None:
    held = postings.get(tokens_hash)
    if held is None:
        return
    if isinstance(held, str):
        if held == donor_id:
            del postings[tokens_hash]
        return
    held.discard(donor_id)
    if len(held) == 1:
        postings[tokens_hash] = next(iter(held))
    elif not held:
        del postings[tokens_hash]


@dataclass
class _WorkerBlocks:
    by_block: dict[int, int] = field(default_factory=dict)  # engine block id -> tokens_hash
    counts: dict[int, int] = field(default_factory=dict)  # tokens_hash -> engine blocks holding it
    postings: dict[int, Posting] = field(default_factory=dict)  # tokens_hash -> donors of this worker using it
    last_event_id: int = 0


class DonorEntry:
    """One donor of the catalog, kept compact: a replica holds one per resident donor (a million in a large fleet).

    A decoded :class:`DonorRegistration` costs ~1.4 KB of pydantic bookkeeping per instance plus its own copies of
    strings every donor shares (deployment, namespace, router id). The entry keeps the fields in slots, those
    strings interned and the hashes in a tuple, and rebuilds the registration (without validation: it was
    validated on arrival) when one is needed, e.g. to answer a peer's sync request.
    """

    __slots__ = (
        "block_hashes",
        "block_size",
        "deployment",
        "donor_id",
        "donor_key",
        "dp_rank",
        "embedding",
        "embedding_dim",
        "namespace",
        "num_tokens",
        "registered_at",
        "router_id",
        "worker_id",
    )

    def __init__(self, registration: DonorRegistration) -> None:
        r = registration
        self.donor_id = r.donor_id
        self.donor_key = r.donor_key
        self.router_id = sys.intern(r.router_id)
        self.worker_id = r.worker_id
        self.dp_rank = r.dp_rank
        self.deployment = sys.intern(r.deployment)
        self.namespace = sys.intern(r.namespace)
        self.num_tokens = r.num_tokens
        self.block_size = r.block_size
        self.block_hashes = tuple(r.block_hashes)
        self.embedding = r.embedding
        self.embedding_dim = r.embedding_dim
        self.registered_at = r.registered_at

    @property
    def worker(self) -> WorkerKey:
        return (self.worker_id, self.dp_rank)

    def vector(self) -> np.ndarray:
        """The embedding as float32 (as :meth:`DonorRegistration.vector`)."""
        return np.frombuffer(self.embedding, dtype="<f2").astype(np.float32)

    @property
    def registration(self) -> DonorRegistration:
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields["block_hashes"] = list(self.block_hashes)
        return DonorRegistration.model_construct(**fields)


class Residency:
    """Per-worker block presence from kv-events plus the donor catalog and its resident sets.

    Residency changes are also queued as ``(donor_id, resident)`` pairs; the owner takes them with
    :meth:`take_changes` after each batch (to add donors to, or drop them from, the search index).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._workers: dict[WorkerKey, _WorkerBlocks] = {}
        self._donors: OrderedDict[str, DonorEntry] = OrderedDict()
        self._missing: dict[str, int] = {}
        self._resident: dict[str, set[str]] = {}
        self._changes: list[tuple[str, bool]] = []
        self.event_gaps = 0
        self.ignored_events: Counter[str] = Counter()

    def _blocks(self, key: WorkerKey) -> _WorkerBlocks:
        blocks = self._workers.get(key)
        if blocks is None:
            blocks = self._workers[key] = _WorkerBlocks()
        return blocks

    # --- kv-events -------------------------------------------------------------------------------
    def apply(self, event: KvEvent) -> None:
        """Called for every decoded kv-event, in arrival order (the router's hot ingest path)."""
        if event.storage_tier != DEVICE_TIER:
            self.ignored_events["storage_tier"] += 1
            return
        key = (event.worker_id, event.dp_rank)
        blocks = self._blocks(key)
        if blocks.last_event_id and event.event_id > blocks.last_event_id + 1:
            self.event_gaps += 1
        if event.event_id > blocks.last_event_id:
            blocks.last_event_id = event.event_id
        data = event.data
        by_block, counts, postings = blocks.by_block, blocks.counts, blocks.postings
        if isinstance(data, KvStored):
            self._store(blocks, zip(data.block_hashes, data.tokens_hashes, strict=True))
        elif isinstance(data, KvRemoved):
            for block_hash in data.block_hashes:
                removed = by_block.pop(block_hash, None)
                if removed is None:
                    self.ignored_events["unknown_block"] += 1
                    continue
                self._drop_block(blocks, removed)
        elif isinstance(data, KvCleared):
            for tokens_hash, posting in postings.items():
                if tokens_hash in counts:
                    self._hash_left(_posting_ids(posting))
            by_block.clear()
            counts.clear()

    def _store(self, blocks: _WorkerBlocks, stored: Iterable[tuple[int, int]]) -> None:
        by_block, counts, postings = blocks.by_block, blocks.counts, blocks.postings
        for block_hash, tokens_hash in stored:
            previous = by_block.get(block_hash)
            if previous == tokens_hash:
                continue
            if previous is not None:
                self._drop_block(blocks, previous)
            by_block[block_hash] = tokens_hash
            held = counts.get(tokens_hash, 0)
            counts[tokens_hash] = held + 1
            if held == 0 and tokens_hash in postings:
                self._hash_arrived(_posting_ids(postings[tokens_hash]))

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
            for block_hash in gone:
                self._drop_block(blocks, blocks.by_block.pop(block_hash))
            new = [(b, tokens_hash) for b, tokens_hash in now.items() if b not in blocks.by_block]
            self._store(blocks, new)
            changed += len(gone) + len(new)
        return changed

    def merge_dump(self, events: Iterable[KvEvent]) -> None:
        """Add what a full dump (Dynamo's recovered index, ``KvRouter.dump_events()``) holds.

        Called after a (re)connect or an event-id gap, to recover stored blocks the live stream missed. It
        only adds: Dynamo's index may lag the stream, so blocks the stream showed are not dropped here
        (removals missed during an outage surface as connector declines, which drop the donor).
        """
        for event in events:
            if isinstance(event.data, KvStored):
                self.apply(event)

    def _drop_block(self, blocks: _WorkerBlocks, tokens_hash: int) -> None:
        left = blocks.counts[tokens_hash] - 1
        if left > 0:
            blocks.counts[tokens_hash] = left
            return
        del blocks.counts[tokens_hash]
        posting = blocks.postings.get(tokens_hash)
        if posting:
            self._hash_left(_posting_ids(posting))

    def _hash_arrived(self, donors: Collection[str]) -> None:
        for donor_id in donors:
            missing = self._missing[donor_id] - 1
            self._missing[donor_id] = missing
            if missing == 0:
                self._resident.setdefault(self._donors[donor_id].namespace, set()).add(donor_id)
                self._changes.append((donor_id, True))

    def _hash_left(self, donors: Collection[str]) -> None:
        for donor_id in donors:
            missing = self._missing[donor_id]
            self._missing[donor_id] = missing + 1
            if missing == 0:
                self._resident[self._donors[donor_id].namespace].discard(donor_id)
                self._changes.append((donor_id, False))

    def take_changes(self) -> list[tuple[str, bool]]:
        """``(donor_id, now_resident)`` transitions since the last call, in order."""
        changes, self._changes = self._changes, []
        return changes

    # --- donors ----------------------------------------------------------------------------------
    def add_donor(self, registration: DonorRegistration) -> list[str]:
        """Add (or refresh) a donor; returns the donor ids pushed out by the capacity bound.

        A donor whose blocks are all present already becomes resident at once (a ``(donor_id, True)`` change).
        """
        donor_id = registration.donor_id
        if donor_id in self._donors:
            self.remove_donor(donor_id)
        entry = DonorEntry(registration)
        blocks = self._blocks(entry.worker)
        distinct = set(registration.block_hashes)
        for tokens_hash in distinct:
            _posting_add(blocks.postings, tokens_hash, donor_id)
        self._donors[donor_id] = entry
        self._missing[donor_id] = sum(1 for h in distinct if h not in blocks.counts)
        if self._missing[donor_id] == 0:
            self._resident.setdefault(entry.namespace, set()).add(donor_id)
            self._changes.append((donor_id, True))
        evicted = []
        while len(self._donors) > self.capacity:
            oldest = next(iter(self._donors))
            self.remove_donor(oldest)
            evicted.append(oldest)
        return evicted

    def remove_donor(self, donor_id: str) -> bool:
        """Forget a donor (no change is queued: the caller knows)."""
        entry = self._donors.pop(donor_id, None)
        if entry is None:
            return False
        blocks = self._workers.get(entry.worker)
        if blocks is not None:
            for tokens_hash in set(entry.block_hashes):
                _posting_discard(blocks.postings, tokens_hash, donor_id)
        self._missing.pop(donor_id, None)
        resident = self._resident.get(entry.namespace)
        if resident is not None:
            resident.discard(donor_id)
        return True

    # --- workers ---------------------------------------------------------------------------------
    def retain_workers(self, live_worker_ids: Collection[int]) -> list[str]:
        """Forget every worker not in ``live_worker_ids`` (discovery changed); returns the donors removed."""
        gone = {key for key in self._workers if key[0] not in live_worker_ids}
        gone |= {entry.worker for entry in self._donors.values() if entry.worker[0] not in live_worker_ids}
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
        """Donor ids resident now in ``namespace`` (a live view: copy it before awaiting)."""
        return self._resident.get(namespace, set())

    def is_resident(self, donor_id: str) -> bool:
        return self._missing.get(donor_id) == 0

    def donor(self, donor_id: str) -> DonorEntry | None:
        return self._donors.get(donor_id)

    def donors(self) -> Iterable[DonorEntry]:
        return self._donors.values()

    def __len__(self) -> int:
        return len(self._donors)

    def __contains__(self, donor_id: object) -> bool:
        return donor_id in self._donors

    def blocks_on(self, key: WorkerKey) -> int:
        blocks = self._workers.get(key)
        return 0 if blocks is None else len(blocks.by_block)

    def workers(self) -> list[WorkerKey]:
        return sorted(set(self._workers) | {entry.worker for entry in self._donors.values()})

    def donors_per_worker(self) -> dict[WorkerKey, tuple[int, int]]:
        """``(donors, resident donors)`` per worker rank."""
        out: dict[WorkerKey, list[int]] = {}
        for donor_id, entry in self._donors.items():
            counts = out.setdefault(entry.worker, [0, 0])
            counts[0] += 1
            counts[1] += self._missing[donor_id] == 0
        return {key: (c[0], c[1]) for key, c in out.items()}

    def snapshot(self) -> list[dict[str, object]]:
        """The catalog in a canonical order (for /debug/donors and replica comparisons)."""
        return [
            {
                "donor_id": entry.donor_id,
                "worker_id": entry.worker[0],
                "dp_rank": entry.worker[1],
                "namespace": entry.namespace,
                "blocks": len(entry.block_hashes),
                "resident": self._missing[entry.donor_id] == 0,
            }
            for entry in sorted(self._donors.values(), key=lambda e: e.donor_id)
        ]
