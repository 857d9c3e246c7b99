"""A peer's search index sent whole to a late replica, beside the donor sync (``...semblend.donors.sync``).

A late replica's catalog converges in seconds; building its usearch index from the same donors took ~2 minutes at
1M (an HNSW insert costs ~0.5 ms of a core). So a replica whose pipeline is empty when its sync starts asks the
first peer that answers for its index saved whole (:mod:`semblend_dynamo.index_snapshot`), and loads it ahead of
the sync's adds (:meth:`~semblend_dynamo.router.indexer.PipelineIndexer.load_snapshot`).

Responder (:class:`SnapshotServer`): saves one snapshot at a time to a temporary file (searches go on meanwhile),
names it by its xxh3-128, answers each request with one part of at most a message's bytes read from that file, and
deletes it once no peer has asked for :data:`SNAPSHOT_TTL_S`. A request for a snapshot it no longer holds gets a
part of none (``parts`` 0), as does every request when it has no index to save.

Requester (:class:`SnapshotFetch`): asks for the first part, then keeps ``window`` parts in flight, each written to
its place in a temporary file; a part not answered in time is asked again, and the fetch is given up after a few
tries. Nothing is lost either way: the sync's adds index every donor the snapshot did not bring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable

from ..donor_index import DonorIndex, DonorIndexError
from ..events.schemas import IndexSnapshotPart
from ..index_snapshot import file_digest

log = logging.getLogger(__name__)

PART_OVERHEAD = 1024
"""Bytes of a part's message besides its data (envelope and fields)."""
SNAPSHOT_TTL_S = 60.0
"""A saved snapshot no peer asked for this long is deleted."""
REUSE_S = 10.0
"""A snapshot saved this recently is sent as it is to a peer asking for one (at most one save per this interval)."""
PARTS_PER_S = 1000.0
"""Part requests answered per second per requesting router (1 GB/s of 1 MiB parts)."""
WINDOW = 8
"""Parts in flight at once per fetch."""
MAX_BYTES_PER_DONOR = 2048
"""The largest snapshot a replica takes, per donor of its index's capacity (usearch keeps ~530 B at 384 dims)."""


class SnapshotServer:
    """The responder's side: one saved snapshot of ``index`` at a time, on disk while peers fetch it."""

    def __init__(
        self,
        index: DonorIndex,
        *,
        router_id: str,
        deployment: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._index = index
        self._router_id = router_id
        self._deployment = deployment
        self._clock = clock
        self._saving = asyncio.Lock()
        self._fd = -1
        self._path: str | None = None
        self._digest = ""
        self._size = 0
        self._saved_at = 0.0
        self._asked_at = 0.0
        self._expiry: asyncio.TimerHandle | None = None
        self.saves = 0

    async def part(self, snapshot: str | None, part: int, part_bytes: int) -> tuple[IndexSnapshotPart, str]:
        """The reply to a request, and its outcome: ``sent``, ``saved`` (a first part of a new snapshot), ``empty``,
        ``unknown`` (a snapshot no longer held, or a part past its end) or ``failed`` (it could not be saved)."""
        outcome = "sent"
        if snapshot is None:
            async with self._saving:
                if self._path is None or self._clock() - self._saved_at > REUSE_S:
                    outcome = await self._save()
            snapshot, part = (self._digest if self._path is not None else None), 0
        if self._path is None or snapshot != self._digest or part * part_bytes >= max(self._size, 1):
            return self._none(), outcome if outcome != "sent" else "unknown"
        self._asked_at = self._clock()
        data = os.pread(self._fd, part_bytes, part * part_bytes)
        reply = IndexSnapshotPart.model_construct(  # from this replica's own file: the receiver validates it
            router_id=self._router_id,
            deployment=self._deployment,
            snapshot=self._digest,
            part=part,
            parts=-(-self._size // part_bytes),
            part_bytes=part_bytes,
            size=self._size,
            data=data,
        )
        return reply, outcome

    def _none(self) -> IndexSnapshotPart:
        return IndexSnapshotPart(router_id=self._router_id, deployment=self._deployment)

    async def _save(self) -> str:
        self.close()
        if not len(self._index):
            return "empty"
        fd, path = tempfile.mkstemp(prefix="semblend-index-", suffix=".snapshot")
        try:
            await asyncio.to_thread(self._index.save_snapshot, path)
            digest = await asyncio.to_thread(file_digest, path)
        except (OSError, DonorIndexError) as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            log.warning("search index snapshot not saved for a peer: %s", exc)
            return "failed"
        self._fd, self._path, self._digest = fd, path, digest
        self._size = os.fstat(fd).st_size
        self._saved_at = self._asked_at = self._clock()
        self.saves += 1
        self._expiry = asyncio.get_running_loop().call_later(SNAPSHOT_TTL_S, self._expire)
        return "saved"

    def _expire(self) -> None:
        left = SNAPSHOT_TTL_S - (self._clock() - self._asked_at)
        if left > 0:
            self._expiry = asyncio.get_running_loop().call_later(left, self._expire)
            return
        self._expiry = None
        self.close()

    @property
    def holding(self) -> bool:
        """Whether a saved snapshot is on disk."""
        return self._path is not None

    def close(self) -> None:
        """Delete the saved snapshot, if any."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._path is not None:
            os.close(self._fd)
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            self._path = None


class SnapshotFetch:
    """The requester's side of one snapshot from one peer: which parts it waits for, where they go."""

    def __init__(
        self,
        peer: str,
        max_size: int,
        *,
        window: int = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.peer = peer
        self.max_size = max_size
        self.window = window
        self._clock = clock
        self.snapshot: str | None = None
        self.path: str | None = None
        self._fd = -1
        self._parts = 0
        self._size = 0
        self._part_bytes = 0
        self._next = 0
        self._left = 0
        self.outstanding: dict[int, int] = {0: 0}
        """Parts asked and not answered yet (part 0 first, of no snapshot named yet), with the times asked again."""
        self._progress_at = clock()
        self.failed: str | None = None
        """Why the fetch was given up: ``none`` (the peer has none), ``gone`` (it no longer holds the one being fetched),
        ``too_large``, ``abandoned``, ``unwritable``."""
        self.loading = False
        """Every part arrived and the file was handed to the indexer."""

    @property
    def complete(self) -> bool:
        return self.snapshot is not None and self._left == 0 and self.failed is None

    def accept(self, part: IndexSnapshotPart) -> list[int] | None:
        """The parts to ask next, or None for a part this fetch did not ask for (or one that ends it: see
        :attr:`failed`)."""
        if self.failed is not None or part.router_id != self.peer:
            return None
        if part.parts == 0 and self.snapshot is not None:  # the peer no longer holds it (saved a newer one)
            return self._fail("gone")
        if part.part not in self.outstanding:
            return None
        if self.snapshot is None:
            return self._first(part)
        if part.snapshot != self.snapshot or part.parts != self._parts or part.size != self._size:
            return None
        del self.outstanding[part.part]
        return self._write(part)

    def _first(self, part: IndexSnapshotPart) -> list[int] | None:
        if part.parts == 0 or part.snapshot is None:
            return self._fail("none")
        if part.size > self.max_size:
            return self._fail("too_large")
        try:
            self._fd, self.path = tempfile.mkstemp(prefix="semblend-peer-index-", suffix=".snapshot")
            os.ftruncate(self._fd, part.size)
        except OSError as exc:
            log.warning("peer's search index not fetched: %s", exc)
            return self._fail("unwritable")
        self.snapshot, self._parts, self._size, self._part_bytes = part.snapshot, part.parts, part.size, part.part_bytes
        self._left, self._next = part.parts, 1
        del self.outstanding[0]
        return self._write(part)

    def _write(self, part: IndexSnapshotPart) -> list[int] | None:
        try:
            os.pwrite(self._fd, part.data, part.part * self._part_bytes)
        except OSError as exc:
            log.warning("peer's search index not fetched: %s", exc)
            return self._fail("unwritable")
        self._left -= 1
        self._progress_at = self._clock()
        asks = []
        while self._next < self._parts and len(self.outstanding) < self.window:
            self.outstanding[self._next] = 0
            asks.append(self._next)
            self._next += 1
        return asks

    def _fail(self, reason: str) -> list[int] | None:
        """Give the fetch up; None (nothing more to ask)."""
        self.failed = reason
        self.outstanding.clear()
        return None

    def overdue(self, timeout_s: float, retries: int) -> list[int]:
        """Parts to ask again (none answered for ``timeout_s``); past ``retries`` the fetch is given up
        (:attr:`failed` ``abandoned``)."""
        if self.failed is not None or self.loading or not self.outstanding:
            return []
        if self._clock() - self._progress_at < timeout_s:
            return []
        if max(self.outstanding.values()) >= retries:
            self._fail("abandoned")
            return []
        self._progress_at = self._clock()
        for part in self.outstanding:
            self.outstanding[part] += 1
        return list(self.outstanding)

    def close(self) -> None:
        """Delete the fetched file (once loaded, or given up)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.path = None
