"""Bounded replies on ``...semblend.donors.sync``: one page per valid request, rate-limited per requester.

A peer may only cost this router what it asks for, a page at a time: a request must decode as a
:class:`~semblend_dynamo.events.schemas.DonorSyncRequest` of this deployment (schema, version and deployment
are checked by the codec), name a reply subject that is the requester's own sync inbox, and fit its requester's
token bucket (and the router-wide one, so rotating ids buys nothing). Anything else is a counted reject, never a
reply. A page holds at most ``sync_page_donors`` registrations and ``max_message_bytes`` bytes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from ..events.schemas import DonorRegistration, DonorSyncPage, DonorSyncRequest

SYNC_INBOX_PREFIX = "_INBOX.semblend."
MAX_REQUESTERS = 1024
"""Requesters with a bucket; the least recently seen is forgotten beyond this (it restarts with a full bucket)."""
GLOBAL_RATE_FACTOR = 8
"""The router-wide bucket allows this many requesters' worth of requests."""


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


def check_request(request: DonorSyncRequest, reply: str, own_router_id: str) -> str | None:
    """Why a decoded request gets no reply: a reject reason, ``""`` when it is not for this router, None to answer."""
    if not reply:
        return "no_reply"
    if reply != sync_inbox(request.router_id):
        return "bad_reply_subject"
    if request.router_id == own_router_id or (request.target is not None and request.target != own_router_id):
        return ""
    return None


def build_page(
    entries: list[tuple[int, DonorRegistration]],
    more: bool,
    *,
    router_id: str,
    deployment: str,
    fits: Callable[[DonorSyncPage], bool],
) -> DonorSyncPage:
    """The page of the largest prefix of ``entries`` (``(cursor, registration)``) that ``fits``.

    ``next_cursor`` is the cursor of the last registration sent, None when nothing is left (``more`` says
    whether the catalog holds more after ``entries``). One registration is always sent alone if need be:
    registrations are bounded by their schema.
    """
    count = len(entries)
    while True:
        rest = count < len(entries) or more
        page = DonorSyncPage(
            router_id=router_id,
            deployment=deployment,
            registrations=[registration for _, registration in entries[:count]],
            next_cursor=entries[count - 1][0] if rest and count else None,
        )
        if count <= 1 or fits(page):
            return page
        count //= 2
