"""Bounded replies on donors.sync: one page per valid request, to the requester's inbox, rate-limited."""

from __future__ import annotations

from typing import Any

import pytest

from semblend_dynamo.events.codec import decode
from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.schemas import DonorRegistration, DonorSyncPage, DonorSyncRequest
from semblend_dynamo.router.sync import SyncLimiter, sync_inbox
from tests.router.test_handler import BLOCK, W1, _router


class RecordingLinkTestDouble(NatsLink):
    """A NatsLink that reports itself connected and records what would be published."""

    published: list[tuple[str, bytes, str]]

    @property
    def connected(self) -> bool:
        return True

    async def publish(self, subject: str, data: bytes, *, reply: str = "") -> None:
        self.published.append((subject, data, reply))


class MsgTestDouble:
    """The two fields of a nats-py Msg the handler reads."""

    def __init__(self, reply: str, data: bytes = b"") -> None:
        self.reply = reply
        self.data = data


def _registration(i: int, deployment: str = "dep") -> DonorRegistration:
    return DonorRegistration(
        donor_id=f"peer-{i}",
        router_id="elsewhere",
        worker_id=W1,
        deployment=deployment,
        namespace="ns",
        num_tokens=BLOCK,
        block_size=BLOCK,
        block_hashes=[i + 1],
        embedding=b"",
        embedding_dim=0,
    )


def _sync_router(**settings: Any):
    router, _ = _router(link_cls=RecordingLinkTestDouble, **settings)
    router.link.published = []  # type: ignore[attr-defined]
    for i in range(10):
        router.catalog.add(_registration(i))
    return router


def _pages(router) -> list[DonorSyncPage]:
    return [decode(data, DonorSyncPage, max_bytes=1 << 20) for _, data, _ in router.link.published]


def _rejects(router, reason: str) -> float:
    return router.metrics.events_rejected.labels("donors_sync", reason)._value.get()


async def test_a_full_catalog_arrives_in_pages_one_reply_per_request() -> None:
    router = _sync_router(sync_page_donors=4, sync_rate_per_s=1000)
    requester = "peer1"
    cursor, seen, requests = 0, [], 0
    while True:
        request = DonorSyncRequest(router_id=requester, deployment="dep", cursor=cursor)
        await router.on_sync_request(request, MsgTestDouble(sync_inbox(requester)))  # type: ignore[arg-type]
        requests += 1
        page = _pages(router)[-1]
        seen += [r.donor_id for r in page.registrations]
        assert len(page.registrations) <= 4
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted(f"peer-{i}" for i in range(10))
    assert requests == 3 and len(router.link.published) == 3 == router.metrics.sync_replies._value.get()
    assert {subject for subject, _, _ in router.link.published} == {sync_inbox(requester)}


@pytest.mark.parametrize(
    ("reply", "target", "reason"),
    [
        ("", None, "no_reply"),
        ("namespace.x.component.y.endpoint.z.kv-events", None, "bad_reply_subject"),
        (sync_inbox("someone-else"), None, "bad_reply_subject"),
        (sync_inbox("peer1"), "another-router", ""),
    ],
)
async def test_requests_that_get_no_reply(reply: str, target: str | None, reason: str) -> None:
    router = _sync_router()
    request = DonorSyncRequest(router_id="peer1", deployment="dep", target=target)
    await router.on_sync_request(request, MsgTestDouble(reply))  # type: ignore[arg-type]
    assert router.link.published == []
    if reason:
        assert _rejects(router, reason) == 1


async def test_each_requester_is_rate_limited_and_rejects_are_counted() -> None:
    router = _sync_router()
    router._sync_limiter = SyncLimiter(5.0, clock=lambda: 0.0)  # a stopped clock: nothing refills
    for requester in ("peer1", "peer2"):
        for _ in range(50):
            request = DonorSyncRequest(router_id=requester, deployment="dep")
            await router.on_sync_request(request, MsgTestDouble(sync_inbox(requester)))  # type: ignore[arg-type]
    assert router.metrics.sync_replies._value.get() == 10  # a burst of 5 each
    assert _rejects(router, "rate_limited") == 90


def test_the_router_wide_bucket_bounds_rotating_requester_ids() -> None:
    clock = [0.0]
    limiter = SyncLimiter(2.0, clock=lambda: clock[0])
    allowed = sum(limiter.allow(f"r{i}") for i in range(1000))
    assert allowed == 16  # 8 requesters' worth of burst
    clock[0] += 1.0
    assert sum(limiter.allow(f"s{i}") for i in range(1000)) == 16


async def test_pages_fit_the_message_limit() -> None:
    router = _sync_router(sync_page_donors=4096, max_message_bytes=2048, sync_rate_per_s=1000)
    for i in range(10, 200):
        router.catalog.add(_registration(i))
    request = DonorSyncRequest(router_id="peer1", deployment="dep")
    await router.on_sync_request(request, MsgTestDouble(sync_inbox("peer1")))  # type: ignore[arg-type]
    (_, data, _), page = router.link.published[0], _pages(router)[0]
    assert len(data) <= 2048 and 0 < len(page.registrations) < 200 and page.next_cursor is not None


async def test_a_page_is_indexed_and_the_next_one_asked_of_that_peer() -> None:
    router = _sync_router()
    page = DonorSyncPage(
        router_id="peer1", deployment="dep", registrations=[_registration(100), _registration(101)], next_cursor=7
    )
    await router.on_sync_page(page, MsgTestDouble(""))  # type: ignore[arg-type]
    assert "peer-100" in router.catalog and "peer-101" in router.catalog
    ((subject, data, reply),) = router.link.published
    follow_up = decode(data, DonorSyncRequest, max_bytes=1 << 20)
    assert subject == router.subjects.donors_sync and reply == router.sync_inbox
    assert (follow_up.target, follow_up.cursor, follow_up.router_id) == ("peer1", 7, router.router_id)


def test_a_page_with_a_foreign_registration_does_not_validate() -> None:
    with pytest.raises(ValueError):
        DonorSyncPage(router_id="p", deployment="dep", registrations=[_registration(1, deployment="other")])
