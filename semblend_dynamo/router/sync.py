"""Donor sync between router replicas on ``...semblend.donors.sync``: bounded replies, pipelined requests.

Responder: a peer may only cost this router what it asks for, a page at a time. A request must decode as a
:class:`~semblend_dynamo.events.schemas.DonorSyncRequest` of this deployment (schema, version and deployment are
checked by the codec), name a reply subject that is the requester's own sync inbox, and fit its requester's token
bucket (and the router-wide one, so rotating ids buys nothing). Anything else is a counted reject, never a reply. A
reply is one columnar :class:`~semblend_dynamo.events.schemas.DonorSyncPage` of at most ``sync_page_donors``
registrations and the message limit's bytes.

Requester (:class:`SyncSession`): on every NATS (re)connect it asks every peer for its first page; the first page
tells how far the peer's catalog cursors go, so the rest is split into ``window`` cursor ranges ("lanes") walked in
parallel, one request in flight per lane: at most ``window`` requests per peer. A peer that goes quiet is asked
again, and given up after a few tries. The pages' rows are held (:class:`HeldPages`) and added to the catalog several
pages at a time, each worker's donors of them in one batch.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..events.schemas import (
    DonorSyncPage,
    DonorSyncRequest,
    IndexSnapshotRequest,
    SyncColumns,
    SyncRows,
)

SYNC_INBOX_PREFIX = "_INBOX.semblend."
MAX_REQUESTERS = 1024
"""Requesters with a bucket; the least recently seen is forgotten beyond this (it restarts with a full bucket)."""
GLOBAL_RATE_FACTOR = 4
"""The router-wide bucket allows this many requesters' worth of requests."""
REPLY_TIMEOUT_S = 2.0
"""A peer with requests in flight and no page for this long is asked again."""
RETRIES = 5
"""Times a quiet peer is asked again before its sync is given up."""
ADD_DONORS = 8192
"""Held pages' donors added together (~8 pages of 1 MiB): residency posts each worker's donors of a chunk in one
batch, and the batch's fixed cost (some 60 numpy calls) is then spread over ~8x more donors than a page's."""
ADD_DELAY_S = 0.2
"""The longest a held page waits (from the first page held) before its donors are added anyway."""
ADD_CHUNK = 2048
"""Held donors added per event-loop turn at most (the loop serves requests between chunks): ~15-25 ms a chunk on a
busy 2-core VM. A chunk holds whole workers' donors of the held pages, so a smaller one would not shrink the
per-worker batches, only add per-chunk work (1,024: +0.5-1 µs a donor at 300K, and no shorter longest chunk)."""

CursorRange = tuple[int, int | None]
"""``(after, upto)``: a peer's catalog cursors in ``(after, upto]`` (``upto`` None: to the end)."""


def sync_inbox(router_id: str) -> str:
    """The only subject a sync reply to ``router_id`` may go to."""
    return f"{SYNC_INBOX_PREFIX}{router_id}"


class TokenBucket:
    """``rate`` tokens per second up to ``burst``; :meth:`take` spends one if there is one."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class SyncLimiter:
    """Per-requester and router-wide token buckets (burst = one second's worth, at least 1)."""

    def __init__(self, rate_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate_per_s
        self._burst = max(1.0, rate_per_s)
        self._clock = clock
        now = clock()
        self._global = TokenBucket(rate_per_s * GLOBAL_RATE_FACTOR, self._burst * GLOBAL_RATE_FACTOR, now)
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def allow(self, requester: str) -> bool:
        now = self._clock()
        bucket = self._buckets.pop(requester, None) or TokenBucket(self._rate, self._burst, now)
        self._buckets[requester] = bucket
        while len(self._buckets) > MAX_REQUESTERS:
            self._buckets.popitem(last=False)
        return bucket.take(now) and self._global.take(now)


def check_request(request: DonorSyncRequest | IndexSnapshotRequest, reply: str, own_router_id: str) -> str | None:
    """Why a decoded request gets no reply: a reject reason, ``""`` when it is not for this router, None to answer."""
    if not reply:
        return "no_reply"
    if reply != sync_inbox(request.router_id):
        return "bad_reply_subject"
    if request.router_id == own_router_id or (request.target is not None and request.target != own_router_id):
        return ""
    return None


def build_page(
    cursors: Sequence[int],
    columns: Callable[[int], SyncColumns],
    more: bool,
    request: DonorSyncRequest,
    *,
    router_id: str,
    deployment: str,
    last_cursor: int,
    max_bytes: int,
    encode: Callable[[DonorSyncPage], bytes],
) -> tuple[bytes, int]:
    """The encoded reply of the largest prefix of a range's donors within ``max_bytes``.

    ``cursors`` are the donors' cursors, ``columns(count)`` the first ``count`` donors as a page's columns, and ``more``
    says whether the requested range holds more after them. Returns the message and how many donors were skipped
    because one alone exceeds ``max_bytes`` (the page then moves the cursor past it).
    """

    def reply(count: int, next_cursor: int | None) -> bytes:
        page = DonorSyncPage.of(
            columns(count),
            router_id=router_id,
            deployment=deployment,
            after=request.after,
            upto=request.upto,
            next_cursor=next_cursor,
            last_cursor=last_cursor,
        )
        return encode(page)

    def after(count: int) -> int | None:
        return cursors[count - 1] if count and (count < len(cursors) or more) else None

    count = len(cursors)
    while count > 1:
        data = reply(count, after(count))
        if len(data) <= max_bytes:
            return data, 0
        count //= 2
    data = reply(count, after(count))
    if len(data) <= max_bytes:
        return data, 0
    return reply(0, after(1)), 1  # one donor alone exceeds a message: the page steps over it


@dataclass
class _PeerSync:
    outstanding: dict[CursorRange, int] = field(default_factory=dict)
    """Ranges asked and not answered yet, with the times each was asked again."""
    progress_at: float = 0.0


class SyncSession:
    """The requester's side of one sync: which pages it waits for, and which requests follow each page.

    A page is expected only as the first page of a peer not seen yet in this session (the broadcast's answer,
    range ``(0, None]``) or as the answer to a range still in flight to its sender; anything else is unsolicited.
    """

    def __init__(self, window: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self.started = clock()
        self._peers: dict[str, _PeerSync] = {}
        self._busy_at = self.started
        self.finished: dict[str, str] = {}
        """Peers no longer synced in this session: ``done`` or ``abandoned``."""

    @property
    def active(self) -> bool:
        return bool(self._peers)

    def touch(self) -> None:
        """The replica is still indexing pages: replies waiting behind them do not make their peers quiet."""
        self._busy_at = self._clock()

    def accept(self, page: DonorSyncPage) -> list[CursorRange] | None:
        """The ranges to ask the page's sender next ([] when it is done), or None for an unsolicited page."""
        now = self._clock()
        peer = page.router_id
        state = self._peers.get(peer)
        if state is None:
            if (page.after, page.upto) != (0, None) or peer in self.finished:
                return None
            state = self._peers[peer] = _PeerSync()
            follow = self._lanes(page)
        else:
            if state.outstanding.pop((page.after, page.upto), None) is None:
                return None
            follow = [] if page.next_cursor is None else [(page.next_cursor, page.upto)]
        state.progress_at = now
        state.outstanding.update(dict.fromkeys(follow, 0))
        if not state.outstanding:
            del self._peers[peer]
            self.finished[peer] = "done"
        return follow

    def _lanes(self, first: DonorSyncPage) -> list[CursorRange]:
        """The rest of a peer's catalog after its first page, cut into at most ``window`` ranges."""
        start, end = first.next_cursor, first.last_cursor
        if start is None:
            return []
        cuts = sorted({start + max(0, end - start) * i // self.window for i in range(self.window)})
        return [*itertools.pairwise(cuts), (cuts[-1], None)]

    def overdue(self, timeout_s: float, retries: int) -> tuple[list[tuple[str, CursorRange]], list[str]]:
        """Requests to send again (no page of their peer, and no page being indexed, for ``timeout_s``) and the peers
        given up."""
        now = self._clock()
        again: list[tuple[str, CursorRange]] = []
        abandoned: list[str] = []
        for peer, state in list(self._peers.items()):
            if now - max(state.progress_at, self._busy_at) < timeout_s:
                continue
            if max(state.outstanding.values()) >= retries:
                del self._peers[peer]
                self.finished[peer] = "abandoned"
                abandoned.append(peer)
                continue
            state.progress_at = now
            for cursor_range in state.outstanding:
                state.outstanding[cursor_range] += 1
                again.append((peer, cursor_range))
        return again, abandoned


Chunk = list[tuple[SyncRows, Sequence[int]]]
"""Donors to add in one call: parts, each a held page's rows and the rows of it (in page order)."""


class HeldPages:
    """Sync pages' rows held back to be added to the catalog several pages at a time.

    :meth:`put` holds a page's rows (in arrival order) and says when ``add_donors`` or more are held; :meth:`seal`
    cuts every held page's rows into chunks of at most ``chunk`` donors by worker: the rows sorted by worker (stable,
    so a donor sent twice keeps its arrival order) are cut into equal chunks, and a chunk takes from each page the
    rows that fall in it, so it holds whole workers' donors of all the pages held (but where a cut falls inside a
    worker) and residency posts each of them in one batch. :meth:`next_chunk` hands each chunk out once. Nothing held
    is dropped: the caller seals and adds it all when it adds.
    """

    def __init__(self, add_donors: int = ADD_DONORS, chunk: int = ADD_CHUNK) -> None:
        self.add_donors = add_donors
        self.chunk = chunk
        self._pages: list[SyncRows] = []
        self.held = 0
        """Donors in pages held and not sealed yet."""
        self._chunks: deque[Chunk] = deque()

    def __bool__(self) -> bool:
        return bool(self._pages or self._chunks)

    def put(self, rows: SyncRows) -> bool:
        """Hold a page's rows; True once the donors held reach ``add_donors``."""
        if len(rows):
            self._pages.append(rows)
            self.held += len(rows)
        return self.held >= self.add_donors

    def seal(self) -> None:
        """Turn the pages held into chunks to add (after any chunks sealed before)."""
        if not self._pages:
            return
        pages, total, self._pages, self.held = self._pages, self.held, [], 0
        count = -(-total // self.chunk)
        if count == 1:
            self._chunks.append([(page, range(len(page))) for page in pages])
            return
        order = np.lexsort((_joined(pages, "dp_ranks"), _joined(pages, "worker_ids")))
        chunk_of = np.empty(total, dtype=np.intp)
        chunk_of[order] = np.arange(total) * count // total
        chunks: list[Chunk] = [[] for _ in range(count)]
        start = 0
        for page in pages:
            mine = chunk_of[start : start + len(page)]
            start += len(page)
            rows_by_chunk = np.argsort(mine, kind="stable")
            ends = np.cumsum(np.bincount(mine, minlength=count)).tolist()
            for c, (begin, end) in enumerate(itertools.pairwise([0, *ends])):
                if end > begin:
                    chunks[c].append((page, rows_by_chunk[begin:end].tolist()))
        self._chunks.extend(chunks)

    def next_chunk(self) -> Chunk | None:
        """The next sealed chunk to add, or None."""
        return self._chunks.popleft() if self._chunks else None


def _joined(pages: Sequence[SyncRows], column: str) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(getattr(page, column) for page in pages), dtype=np.uint64)
