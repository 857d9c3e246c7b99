"""Donor sync: bounded replies (one columnar page per valid request, to the requester's inbox, rate-limited) and the
requester's pipelined lanes."""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Any

import msgpack
import numpy as np
import pytest

from semblend_dynamo.events.codec import RejectedMessage, decode, encode
from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.schemas import (
    MAX_SYNC_PAGE,
    SYNC_PAGE_OVERHEAD,
    DonorRegistration,
    DonorSyncPage,
    DonorSyncRequest,
    IndexSnapshotRequest,
    KvEvent,
    KvEventBatch,
    KvStored,
    SyncColumns,
    sync_page_bytes,
)
from semblend_dynamo.router import handler as handler_module
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.residency import DonorEntry, Residency, sync_columns, sync_row_bytes
from semblend_dynamo.router.sync import (
    RETRIES,
    HeldPages,
    SyncLimiter,
    SyncSession,
    sync_inbox,
)
from semblend_dynamo.vector_codes import i8_codes, to_f16
from tests.router.test_handler import BLOCK, W1, _router
from tests.support.small_maps import small_block_maps


class RecordingLinkTestDouble(NatsLink):
    """A NatsLink that reports itself connected and records what would be published."""

    published: list[tuple[str, bytes, str]]
    server_max_payload: int | None = None

    @property
    def connected(self) -> bool:
        return True

    @property
    def max_payload(self) -> int | None:
        return self.server_max_payload

    async def publish(self, subject: str, data: bytes, *, reply: str = "") -> None:
        self.published.append((subject, data, reply))


class MsgTestDouble:
    """The two fields of a nats-py Msg the handler reads."""

    def __init__(self, reply: str, data: bytes = b"") -> None:
        self.reply = reply
        self.data = data


def _registration(i: int, deployment: str = "dep", *, dim: int = 0, blocks: int = 1) -> DonorRegistration:
    embedding = np.arange(dim, dtype="<f2").tobytes()
    return DonorRegistration(
        donor_id=f"peer-{i}",
        donor_key=f"{i:016x}" if i % 2 else None,
        router_id="elsewhere" if i % 3 else "third",
        worker_id=W1 if i % 2 else (1 << 64) - 1,
        dp_rank=i % 3,
        deployment=deployment,
        namespace="ns" if i % 4 else "other-ns",
        num_tokens=BLOCK * (blocks + 1) + i,
        block_size=BLOCK,
        block_hashes=[(i * 7919 + b) % (1 << 64) for b in range(blocks)] + ([(1 << 64) - 1] if i % 5 == 0 else []),
        embedding=embedding,
        embedding_dim=dim,
        registered_at=1000.0 + i / 7,
    )


def _sync_router(donors: int = 10, **settings: Any):
    router, _ = _router(link_cls=RecordingLinkTestDouble, **settings)
    router.link.published = []  # type: ignore[attr-defined]
    router.catalog.add_many(_registration(i) for i in range(donors))
    return router


def _pages(router) -> list[DonorSyncPage]:
    return [decode(data, DonorSyncPage, max_bytes=1 << 20) for _, data, _ in router.link.published]


def _requests(router) -> list[DonorSyncRequest]:
    """The donor sync requests published (an empty replica's search index request aside: tests/router/test_index_sync.py)."""
    sent = [
        decode(data, (DonorSyncRequest, IndexSnapshotRequest), max_bytes=1 << 20)
        for _, data, _ in router.link.published
    ]
    return [request for request in sent if isinstance(request, DonorSyncRequest)]


def _counter(router, stream: str, reason: str) -> float:
    return router.metrics.events_rejected.labels(stream, reason)._value.get()


async def _ask(router, requester: str = "peer1", **fields: Any) -> None:
    request = DonorSyncRequest(router_id=requester, deployment="dep", **fields)
    await router.on_sync_request(request, MsgTestDouble(sync_inbox(requester)))


def _page(registrations: list[DonorRegistration], **fields: Any) -> DonorSyncPage:
    values: dict[str, Any] = {"router_id": "peer1", "deployment": "dep", "after": 0, "upto": None}
    values |= {"next_cursor": None, "last_cursor": len(registrations)} | fields
    return DonorSyncPage.of(registrations, **values)


# --- the page format ---------------------------------------------------------------------------------------------
def test_a_page_carries_every_field_of_every_registration() -> None:
    registrations = [_registration(i, dim=384 if i % 2 else 0, blocks=i % 4 + 1) for i in range(12)]
    page = _page(registrations, next_cursor=12, last_cursor=40)
    back = decode(encode(page), DonorSyncPage, max_bytes=1 << 20)
    assert back.registrations() == registrations
    assert [r.model_dump() for r in back.registrations()] == [r.model_dump() for r in registrations]
    assert (back.next_cursor, back.last_cursor, back.router_ids, back.namespaces) == (
        12,
        40,
        ["third", "elsewhere"],
        ["other-ns", "ns"],
    )


def test_the_page_size_bound_holds_for_any_mix_of_donors() -> None:
    rng = np.random.default_rng(3)
    for trial in range(20):
        registrations = [
            _registration(i, dim=int(rng.choice([0, 8, 384])), blocks=int(rng.integers(1, 40)))
            for i in range(trial * 50, trial * 50 + int(rng.integers(1, 60)))
        ]
        data = encode(_page(registrations, next_cursor=(1 << 64) - 1, last_cursor=(1 << 64) - 1))
        assert len(data) <= SYNC_PAGE_OVERHEAD + sum(sync_page_bytes(r) for r in registrations)


def _entries(registrations: list[DonorRegistration], codes: bool) -> list[DonorEntry]:
    """A catalog's entries of ``registrations``, keeping int8 codes (``codes``) or float16."""
    residency = Residency(capacity=10_000, codes=codes)
    residency.add_many(registrations)
    return residency.entries([r.donor_id for r in registrations])


def test_a_page_carries_each_embedding_in_its_form_and_each_replica_keeps_its_own() -> None:
    """A page of a catalog's entries carries int8 codes where the sender keeps codes and float16 where it keeps
    float16 (here both in one page). A replica keeping codes ends with codes of every donor (the sender's, or those of
    a float16 one: what its i8 index stores), a replica keeping float16 with float16 (codes as their unit vector):
    neither mixes forms. The page's registrations are float16, and its size bound holds."""
    rng = np.random.default_rng(5)
    regs = [
        _registration(i, dim=16, blocks=2).model_copy(
            update={"embedding": rng.standard_normal(16).astype("<f2").tobytes()}
        )
        for i in range(40)
    ]
    regs.append(_registration(40, dim=0))
    sent = _entries(regs[:20], codes=True) + _entries(regs[20:], codes=False)
    assert sync_page_bytes(sent[0]) == sync_page_bytes(regs[0]) - 16  # 1 byte a dimension instead of 2
    data = encode(_page(sent))  # type: ignore[arg-type]
    assert len(data) <= SYNC_PAGE_OVERHEAD + sum(sync_page_bytes(e) for e in sent)
    back = decode(data, DonorSyncPage, max_bytes=1 << 20)
    rows = back.rows()
    assert rows.embedding_codes == [True] * 20 + [False] * 21
    codes = [i8_codes(r.vector().reshape(1, -1))[0][0].tobytes() for r in regs[:40]]
    for keeps_codes in (True, False):
        kept, _ = Residency(capacity=100, codes=keeps_codes).add_rows([(rows, range(len(rows)))])
        assert [e.donor_id for e in kept] == [r.donor_id for r in regs]
        assert all(e.embedding_codes is keeps_codes for e in kept[:40]) and kept[40].embedding == b""
        if keeps_codes:
            assert [e.embedding for e in kept[:40]] == codes
        else:
            expected = [to_f16(c, True) for c in codes[:20]] + [r.embedding for r in regs[20:40]]
            assert [e.embedding for e in kept[:40]] == expected
    float16 = [to_f16(c, True) for c in codes[:20]] + [r.embedding for r in regs[20:]]
    assert [r.embedding for r in back.registrations()] == float16


def _payload(page: DonorSyncPage) -> dict[str, Any]:
    return msgpack.unpackb(msgpack.unpackb(encode(page))["payload"])


def _with(page: DonorSyncPage, **fields: Any) -> bytes:
    payload = _payload(page) | fields
    return msgpack.packb(
        {"topic": "semblend.donors.sync", "payload": msgpack.packb(payload, use_bin_type=True)}, use_bin_type=True
    )


def test_a_page_built_from_entry_columns_is_the_page_of_their_registrations() -> None:
    """``sync_columns`` (the serving replica's path: column operations on the entries' blobs) against
    ``SyncColumns.of`` (a property read a field a donor), for entries of mixed hash counts and dims, both embedding
    forms, keys and no keys, a non-ASCII router id: the same columns, whether each entry holds its embedding or the
    search index gives it back; ``sync_row_bytes`` is ``sync_page_bytes`` entry by entry."""
    rng = np.random.default_rng(11)
    regs = [
        _registration(i, dim=int(rng.choice([0, 8, 24])), blocks=int(rng.integers(1, 12))).model_copy(
            update={"router_id": "ルータ" if i == 7 else ("elsewhere" if i % 3 else "third")}
        )
        for i in range(60)
    ]
    for i, r in enumerate(regs):
        regs[i] = r.model_copy(update={"embedding": rng.standard_normal(r.embedding_dim).astype("<f2").tobytes()})
    entries = _entries(regs[:30], codes=True) + _entries(regs[30:], codes=False)
    expected = SyncColumns.of(entries)
    assert sync_columns(entries, [e.blob for e in entries], [None] * len(entries)) == expected
    assert sync_row_bytes(entries) == [sync_page_bytes(e) for e in entries]
    held = [e.own_embedding for e in entries]
    for entry in entries[::2]:  # the search index holds these
        entry.drop_embedding()
    given = [None if e.embedded else held[i] for i, e in enumerate(entries)]
    blobs = [e.blob for e in entries]
    assert given.count(None) < len(entries) and sync_columns(entries, blobs, given) == expected
    assert sync_row_bytes(entries) == [sync_page_bytes(e) for e in entries]
    page = DonorSyncPage.of(
        sync_columns(entries, blobs, given),
        router_id="peer1",
        deployment="dep",
        after=0,
        upto=None,
        next_cursor=None,
        last_cursor=60,
    )
    back = decode(encode(page), DonorSyncPage, max_bytes=1 << 20).registrations()
    assert [r.donor_id for r in back] == [r.donor_id for r in regs]
    assert [r.block_hashes for r in back] == [r.block_hashes for r in regs]
    assert [r.embedding for r in back[30:]] == [r.embedding for r in regs[30:]]  # float16 kept as sent
    assert sync_columns([], [], []) == SyncColumns.of([])


def _u(values: list[float] | list[int], dtype: str) -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


GOOD = _page([_registration(1, dim=4, blocks=2), _registration(2, dim=4, blocks=2)])
MALFORMED = {
    "short_column": {"worker_ids": _u([1], "<u8")},
    "keys_length": {"donor_keys": [None]},
    "twice": {"donor_ids": ["peer-1", "peer-1"]},
    "router_index": {"router_index": _u([0, 5], "<u2")},
    "namespace_index": {"namespace_index": _u([0, 9], "<u2")},
    "block_size_zero": {"block_sizes": _u([16, 0], "<u2")},
    "block_size_big": {"block_sizes": _u([16, 2048], "<u2")},
    "hash_count": {"block_counts": _u([2, 3], "<u4")},
    "too_many_hashes": {"block_counts": _u([2, 1 << 20], "<u4")},
    "embedding_bytes": {"embeddings": b"\0" * 6},
    "embedding_dim": {"embedding_dims": _u([4, 5000], "<u2")},
    "embedding_form": {"embedding_codes": _u([0, 2], "u1")},
    "embedding_form_bytes": {"embedding_codes": _u([1, 0], "u1")},  # codes of 4 bytes, but 8 were sent
    "not_finite": {"registered_at": _u([1.0, float("nan")], "<f8")},
    "too_few_tokens": {"num_tokens": _u([32, 31], "<u8")},  # 2 blocks of 16 each
    "empty_id": {"donor_ids": ["", "x"]},
    "long_namespace": {"namespaces": ["n" * 65]},
    "too_many_donors": {"donor_ids": [f"d{i}" for i in range(MAX_SYNC_PAGE + 1)]},
    "hashes_not_bytes": {"block_hashes": [1, 2, 3, 4]},
    "cursor_not_u64": {"next_cursor": -1},
}


@pytest.mark.parametrize("fields", MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_page_is_rejected_whole(fields: dict[str, Any]) -> None:
    assert decode(_with(GOOD), DonorSyncPage, max_bytes=1 << 20, deployment="dep").registrations()
    with pytest.raises(RejectedMessage) as info:
        decode(_with(GOOD, **fields), DonorSyncPage, max_bytes=1 << 20, deployment="dep")
    assert info.value.reason == "invalid_fields"


def test_pages_of_another_deployment_or_version_are_rejected() -> None:
    for data, reason in [
        (encode(_page([_registration(1)], deployment="other")), "wrong_namespace"),
        (_with(GOOD, schema="semblend.syncpage/v1"), "wrong_version"),
        (encode(GOOD)[:-3], "truncated"),
    ]:
        with pytest.raises(RejectedMessage) as info:
            decode(data, DonorSyncPage, max_bytes=1 << 20, deployment="dep")
        assert info.value.reason == reason
    with pytest.raises(ValueError):
        DonorSyncRequest(router_id="r", deployment="dep", after=5, upto=5)


# --- the responder -----------------------------------------------------------------------------------------------
async def test_a_full_catalog_arrives_in_pages_one_reply_per_request() -> None:
    router = _sync_router(sync_page_donors=4, sync_rate_per_s=1000)
    after, seen, requests = 0, [], 0
    while True:
        await _ask(router, after=after)
        requests += 1
        page = _pages(router)[-1]
        seen += page.donor_ids
        assert len(page) <= 4 and page.last_cursor == 10 and page.after == after
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert sorted(seen) == sorted(f"peer-{i}" for i in range(10))
    assert requests == 3 and len(router.link.published) == 3 == router.metrics.sync_replies._value.get()
    assert {subject for subject, _, _ in router.link.published} == {sync_inbox("peer1")}


async def test_a_replica_that_served_a_sync_hands_the_freed_heap_back_once_the_requests_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replies a sync is served (pages, snapshot parts, the client's buffers) leave freed heap behind: once no
    request came for ``QUIET_TRIM_DELAY_S``, it goes back to the OS, once for a whole run of requests."""
    monkeypatch.setattr(handler_module, "QUIET_TRIM_DELAY_S", 0.05)
    trims: list[int] = []
    monkeypatch.setattr(handler_module, "trim_heap", lambda: trims.append(1) or True)
    router = _sync_router(sync_page_donors=2, sync_rate_per_s=1000)
    for after in range(0, 10, 2):
        await _ask(router, after=after)
        await asyncio.sleep(0.02)
        assert not trims and router.settling  # requests keep coming
    for _ in range(100):
        if trims and not router.settling:
            break
        await asyncio.sleep(0.01)
    assert trims == [1] and not router.settling
    await _ask(router, requester="peer1", target="other")  # not for this router: nothing served
    await asyncio.sleep(0.1)
    assert trims == [1]
    router.close()


async def test_a_range_ends_at_its_upper_cursor() -> None:
    router = _sync_router(sync_rate_per_s=1000)
    await _ask(router, after=3, upto=7)
    (page,) = _pages(router)
    assert page.donor_ids == [f"peer-{i}" for i in range(3, 7)] and page.next_cursor is None
    assert (page.after, page.upto) == (3, 7)


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
    await router.on_sync_request(request, MsgTestDouble(reply))
    assert router.link.published == []
    if reason:
        assert _counter(router, "donors_sync", reason) == 1


async def test_each_requester_is_rate_limited_and_rejects_are_counted() -> None:
    router = _sync_router()
    router._sync_limiter = SyncLimiter(5.0, clock=lambda: 0.0)  # a stopped clock: nothing refills
    for requester in ("peer1", "peer2"):
        for _ in range(50):
            await _ask(router, requester)
    assert router.metrics.sync_replies._value.get() == 10  # a burst of 5 each
    assert _counter(router, "donors_sync", "rate_limited") == 90


def test_the_router_wide_bucket_bounds_rotating_requester_ids() -> None:
    clock = [0.0]
    limiter = SyncLimiter(2.0, clock=lambda: clock[0])
    allowed = sum(limiter.allow(f"r{i}") for i in range(1000))
    assert allowed == 8  # 4 requesters' worth of burst
    clock[0] += 1.0
    assert sum(limiter.allow(f"s{i}") for i in range(1000)) == 8


@pytest.mark.parametrize(("config_bytes", "server_bytes"), [(8192, None), (1 << 20, 8192)])
async def test_pages_fit_the_message_limit_and_the_servers(config_bytes: int, server_bytes: int | None) -> None:
    router = _sync_router(0, max_message_bytes=config_bytes, sync_rate_per_s=1000)
    router.link.server_max_payload = server_bytes
    router.catalog.add_many(_registration(i, dim=384) for i in range(100))
    after, seen = 0, []
    while after is not None:
        await _ask(router, after=after)
        (_, data, _), page = router.link.published[-1], _pages(router)[-1]
        assert len(data) <= 8192 and 0 < len(page) < 100
        seen += page.donor_ids
        after = page.next_cursor
    assert len(seen) == len(set(seen)) == 100


async def test_a_donor_larger_than_a_message_is_stepped_over_and_counted() -> None:
    router = _sync_router(0, max_message_bytes=4096, sync_rate_per_s=1000)
    router.catalog.add_many([_registration(0), _registration(1, blocks=600), _registration(2)])
    after, seen = 0, []
    while after is not None:
        await _ask(router, after=after)
        page = _pages(router)[-1]
        seen += page.donor_ids
        after = page.next_cursor
    assert seen == ["peer-0", "peer-2"]
    assert router.metrics.events_dropped.labels("syncpage", "oversized")._value.get() == 1


# --- the requester -----------------------------------------------------------------------------------------------
def test_the_first_page_splits_the_rest_into_window_lanes() -> None:
    session = SyncSession(window=4, clock=lambda: 0.0)
    lanes = session.accept(_page([_registration(1)], next_cursor=100, last_cursor=900))
    assert lanes == [(100, 300), (300, 500), (500, 700), (700, None)]
    assert session.accept(_page([_registration(1)], after=300, upto=500, next_cursor=400)) == [(400, 500)]
    assert session.accept(_page([], after=300, upto=500)) is None  # answered already
    assert session.accept(_page([], router_id="peer2", after=100, upto=300)) is None  # never asked
    for after, upto in [(100, 300), (400, 500), (500, 700), (700, None)]:
        assert session.accept(_page([], after=after, upto=upto)) == []
    assert not session.active and session.finished == {"peer1": "done"}
    assert session.accept(_page([])) is None  # a finished peer's first page again: unsolicited
    assert SyncSession(4).accept(_page([], next_cursor=3, last_cursor=3)) == [(3, None)]
    assert SyncSession(4).accept(_page([])) == []


def test_a_quiet_peer_is_asked_again_then_given_up() -> None:
    clock = [0.0]
    session = SyncSession(window=2, clock=lambda: clock[0])
    assert session.accept(_page([], next_cursor=10, last_cursor=30)) == [(10, 20), (20, None)]
    clock[0] = 1.0
    assert session.overdue(2.0, RETRIES) == ([], [])
    for attempt in range(RETRIES):
        clock[0] += 2.0
        assert session.overdue(2.0, RETRIES) == ([("peer1", (10, 20)), ("peer1", (20, None))], []), attempt
    clock[0] += 2.0
    assert session.overdue(2.0, RETRIES) == ([], ["peer1"])
    assert session.finished == {"peer1": "abandoned"} and not session.active


def test_a_peer_is_not_quiet_while_the_replica_is_busy_indexing_pages() -> None:
    clock = [0.0]
    session = SyncSession(window=2, clock=lambda: clock[0])
    session.accept(_page([], next_cursor=10, last_cursor=30))
    for _ in range(10):  # its next pages wait behind a slow page being indexed (a search index filling)
        clock[0] += 1.5
        session.touch()
        assert session.overdue(2.0, RETRIES) == ([], [])
    clock[0] += 2.0
    assert session.overdue(2.0, RETRIES) == ([("peer1", (10, 20)), ("peer1", (20, None))], [])


async def test_the_requester_asks_each_lane_and_indexes_only_pages_it_asked_for() -> None:
    router = _sync_router(0, sync_window=3)
    await router.request_sync()
    (broadcast,) = _requests(router)
    assert (broadcast.target, broadcast.after, broadcast.upto, broadcast.router_id) == (None, 0, None, router.router_id)
    router.link.published.clear()
    await router.on_sync_page(_page([_registration(1)], next_cursor=5, last_cursor=35), MsgTestDouble(""))
    assert [(r.target, r.after, r.upto) for r in _requests(router)] == [
        ("peer1", 5, 15),
        ("peer1", 15, 25),
        ("peer1", 25, None),
    ]
    assert {reply for _, _, reply in router.link.published} == {router.sync_inbox}
    await router.on_sync_page(_page([_registration(2)], after=5, upto=15), MsgTestDouble(""))
    await router.on_sync_page(_page([_registration(3)], after=5, upto=15), MsgTestDouble(""))  # again: unsolicited
    await router.on_sync_page(_page([_registration(4)], router_id="stranger", after=9), MsgTestDouble(""))
    await router.on_sync_page(_page([_registration(5)], router_id=router.router_id), MsgTestDouble(""))
    assert _counter(router, "sync_pages", "unsolicited") == 3
    assert "peer-1" not in router.catalog  # held: lanes are still awaited
    for after, upto in [(15, 25), (25, None)]:
        await router.on_sync_page(_page([], after=after, upto=upto), MsgTestDouble(""))
    assert router.metrics.sync_peers.labels("done")._value.get() == 1
    assert "peer-1" in router.catalog and "peer-2" in router.catalog  # the sync is over: every held page added
    assert "peer-3" not in router.catalog and "peer-4" not in router.catalog and "peer-5" not in router.catalog


async def test_the_collector_skips_what_is_alive_while_pages_are_awaited_and_walks_it_again_after() -> None:
    router = _sync_router(0, sync_window=2)
    router._held.add_donors = 1  # each page added when it comes
    await router.request_sync()
    assert gc.get_freeze_count() == 0
    await router.on_sync_page(_page([_registration(1)], next_cursor=5, last_cursor=15), MsgTestDouble(""))
    assert gc.get_freeze_count() > 0  # two lanes still to come
    await router.on_sync_page(_page([_registration(2)], after=5, upto=10), MsgTestDouble(""))
    assert gc.get_freeze_count() > 0
    await router.on_sync_page(_page([_registration(3)], after=10), MsgTestDouble(""))
    assert gc.get_freeze_count() == 0 and all(f"peer-{i}" in router.catalog for i in (1, 2, 3))


async def test_a_chunk_added_while_pages_are_awaited_runs_without_the_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    router = _sync_router(0, sync_window=2)
    router._held.add_donors = 1  # each page added when it comes
    add_rows = router.catalog.add_rows
    collecting: list[bool] = []

    def add_rows_seen(*args: Any, **kwargs: Any) -> int:
        collecting.append(gc.isenabled())
        return add_rows(*args, **kwargs)

    monkeypatch.setattr(router.catalog, "add_rows", add_rows_seen)
    was = gc.isenabled()  # the test needs it on
    gc.enable()
    try:
        await router.request_sync()
        await router.on_sync_page(_page([_registration(1)], next_cursor=5, last_cursor=15), MsgTestDouble(""))
        assert collecting == [False] and gc.isenabled() and gc.get_freeze_count() > 0  # more lanes to come
        await router.on_sync_page(_page([_registration(2)], after=5, upto=10), MsgTestDouble(""))
        await router.on_sync_page(_page([_registration(3)], after=10), MsgTestDouble(""))  # the last: sync over
        assert collecting == [False, False, True] and gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        if not was:
            gc.disable()
    assert all(f"peer-{i}" in router.catalog for i in (1, 2, 3))


async def test_a_sync_whose_peers_go_quiet_thaws_the_collector_when_it_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handler_module, "REPLY_TIMEOUT_S", 0.02)
    router = _sync_router(0, sync_window=2)
    router._held.add_donors = 1
    await router.request_sync()
    await router.on_sync_page(_page([_registration(1)], next_cursor=5, last_cursor=15), MsgTestDouble(""))
    assert gc.get_freeze_count() > 0
    await asyncio.wait_for(router._sync_watch, 5)  # the peer is asked again, then given up
    assert gc.get_freeze_count() == 0 and router.metrics.sync_peers.labels("abandoned")._value.get() == 1


async def test_a_page_echoing_own_registrations_does_not_add_them_as_peers() -> None:
    router = _sync_router(0)
    await router.request_sync()
    own = _registration(7).model_copy(update={"router_id": router.router_id})
    await router.on_sync_page(_page([own, _registration(8)]), MsgTestDouble(""))
    assert "peer-7" not in router.catalog and "peer-8" in router.catalog


def test_held_donors_are_added_in_equal_chunks_of_at_most_the_chunk_size() -> None:
    pages = [
        decode(encode(_page([_registration(i) for i in range(n)])), DonorSyncPage, max_bytes=1 << 20) for n in (6, 4)
    ]
    for most, sizes in [(10, [10]), (5, [5, 5]), (4, [4, 3, 3])]:
        held = HeldPages(chunk=most)
        for page in pages:
            held.put(page.rows())
        held.seal()
        chunks = []
        while (chunk := held.next_chunk()) is not None:
            chunks.append(chunk)
        assert [sum(len(picked) for _, picked in chunk) for chunk in chunks] == sizes, most


# --- held pages --------------------------------------------------------------------------------------------------
def test_held_pages_are_cut_by_worker_into_chunks_with_every_row_once() -> None:
    pages = [
        decode(
            encode(_page([_registration(i, dim=8 * (i % 3), blocks=i % 4 + 1) for i in range(start, stop)])),
            DonorSyncPage,
            max_bytes=1 << 20,
        ).rows()
        for start, stop in [(0, 7), (7, 8), (8, 20)]
    ]
    held = HeldPages(add_donors=15, chunk=6)
    assert not held and not held.put(pages[0]) and not held.put(pages[1]) and held
    assert held.put(pages[2]) and held.held == 20
    held.seal()
    assert held.held == 0 and held
    chunks = []
    while (chunk := held.next_chunk()) is not None:
        chunks.append(chunk)
    assert not held and [sum(len(picked) for _, picked in chunk) for chunk in chunks] == [5, 5, 5, 5]
    taken = [[(page, i) for page, picked in chunk for i in picked] for chunk in chunks]
    every = [(page, i) for part in taken for page, i in part]
    assert sorted((id(page), i) for page, i in every) == sorted(
        (id(page), i) for page in pages for i in range(len(page))
    )
    workers = [[(page.worker_ids[i], page.dp_ranks[i]) for page, i in part] for part in taken]
    assert all(max(a) <= min(b) for a, b in itertools.pairwise(workers))  # chunks follow each other by worker
    for chunk in chunks:  # each page's rows of a chunk in page order, the pages in arrival order
        assert [pages.index(page) for page, _ in chunk] == sorted(pages.index(page) for page, _ in chunk)
        assert all(list(picked) == sorted(picked) for _, picked in chunk)


def _sync_catalog_of(registrations: list[DonorRegistration]) -> list[dict[str, object]]:
    reference = _sync_router(0)
    reference.catalog.add_many(registrations)
    return reference.catalog.snapshot()


async def test_pages_answered_out_of_order_end_as_every_donor_added_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler_module, "ADD_DELAY_S", 60.0)
    router = _sync_router(0, sync_window=3)
    await router.request_sync()
    registrations = [_registration(i, blocks=2) for i in range(40)]
    await router.on_sync_page(_page(registrations[:10], next_cursor=10, last_cursor=40), MsgTestDouble(""))
    lanes = [((10, 20), registrations[10:20]), ((20, 30), registrations[20:30]), ((30, None), registrations[30:])]
    for (after, upto), regs in reversed(lanes):  # the last lane answers first
        assert len(router.catalog) == 0  # held until the sync is over (or enough are held, or the delay passed)
        await router.on_sync_page(_page(regs, after=after, upto=upto), MsgTestDouble(""))
    assert router.catalog.snapshot() == _sync_catalog_of(registrations) and not router._held
    assert gc.get_freeze_count() == 0


async def test_a_sync_adds_its_donors_to_block_maps_settled_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block maps left mid-rewrite (by a replica's blocks recovered just before its sync) are settled, a bounded step a
    loop turn, before held donors are added: a map mid-rewrite cannot write a held block's posting in place, so each
    would go to its overlay and grow it into more rewrites."""
    small_block_maps(monkeypatch)
    monkeypatch.setattr(handler_module, "SETTLE_ENTRIES", 100)
    steps: list[int] = []
    settle = DonorCatalog.settle_maps
    monkeypatch.setattr(DonorCatalog, "settle_maps", lambda self, n: steps.append(n) or settle(self, n))
    router = _sync_router(0, sync_window=1)
    router._held.add_donors = 10
    registrations = [_registration(2 * i + 1, blocks=300) for i in range(20)]  # worker W1, rank 0, 1 or 2
    for rank in range(3):  # the blocks recovered
        hashes = [h for r in registrations if r.dp_rank == rank for h in r.block_hashes]
        for event_id, first in enumerate(range(0, len(hashes), 200), start=1):
            stored = KvStored(list(range(first, first + 200))[: len(hashes) - first], hashes[first : first + 200])
            event = KvEvent(worker_id=W1, event_id=event_id, data=stored, dp_rank=rank)
            router.on_kv_events(KvEventBatch(1, 0, 0, [event]))
    assert router.catalog.maps_rewrite_left() > 0
    add_rows = router.catalog.add_rows
    left_at_add: list[int] = []

    def add_rows_seen(*args: Any, **kwargs: Any) -> int:
        left_at_add.append(router.catalog.maps_rewrite_left())
        return add_rows(*args, **kwargs)

    monkeypatch.setattr(router.catalog, "add_rows", add_rows_seen)
    await router.request_sync()
    await router.on_sync_page(_page(registrations[:10], next_cursor=10, last_cursor=20), MsgTestDouble(""))
    assert left_at_add == [0] and len(steps) > 2 and set(steps) == {100}
    await router.on_sync_page(_page(registrations[10:], after=10), MsgTestDouble(""))
    assert left_at_add[0] == 0 and len(router.catalog) == 20
    assert all(router.catalog.is_resident(r.donor_id) for r in registrations)
    assert gc.get_freeze_count() == 0


async def test_held_pages_are_added_once_enough_are_held_or_after_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler_module, "ADD_DELAY_S", 0.05)
    router = _sync_router(0, sync_window=4)
    router._held.add_donors = 5
    await router.request_sync()
    await router.on_sync_page(
        _page([_registration(i) for i in range(3)], next_cursor=3, last_cursor=99), MsgTestDouble("")
    )
    assert len(router.catalog) == 0
    await router.on_sync_page(_page([_registration(i) for i in range(3, 5)], after=3, upto=27), MsgTestDouble(""))
    assert len(router.catalog) == 5 and not router._held and gc.get_freeze_count() > 0  # five held: added at once
    await router.on_sync_page(_page([_registration(5)], after=27, upto=51), MsgTestDouble(""))
    assert "peer-5" not in router.catalog
    await asyncio.sleep(0.2)  # no more pages: the delay adds what is held
    assert "peer-5" in router.catalog and not router._held
    router._sync_gc.thaw()


async def test_a_peer_given_up_mid_sync_leaves_its_held_pages_added(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler_module, "REPLY_TIMEOUT_S", 0.02)
    monkeypatch.setattr(handler_module, "ADD_DELAY_S", 60.0)
    router = _sync_router(0, sync_window=2)
    await router.request_sync()
    await router.on_sync_page(_page([_registration(1)], next_cursor=5, last_cursor=15), MsgTestDouble(""))
    await router.on_sync_page(_page([_registration(2)], after=5, upto=10), MsgTestDouble(""))
    assert len(router.catalog) == 0
    await asyncio.wait_for(router._sync_watch, 5)  # the other lane never answers: the peer is given up
    assert router.metrics.sync_peers.labels("abandoned")._value.get() == 1
    assert "peer-1" in router.catalog and "peer-2" in router.catalog and not router._held
    assert gc.get_freeze_count() == 0


async def test_closing_with_pages_held_adds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler_module, "ADD_DELAY_S", 60.0)
    router = _sync_router(0, sync_window=2)
    await router.request_sync()
    await router.on_sync_page(_page([_registration(1)], next_cursor=5, last_cursor=15), MsgTestDouble(""))
    await router.on_sync_page(_page([_registration(2)], after=5, upto=10), MsgTestDouble(""))
    assert len(router.catalog) == 0
    router.close()
    assert "peer-1" in router.catalog and "peer-2" in router.catalog and not router._held
    assert gc.get_freeze_count() == 0


async def test_a_donor_sent_twice_while_held_keeps_its_newest_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two peers send the same donors (and one page comes again, unsolicited): held together, the catalog keeps one
    entry a donor, the newest copy, as when the pages are added one at a time."""
    monkeypatch.setattr(handler_module, "ADD_DELAY_S", 60.0)
    router = _sync_router(0, sync_window=2)
    await router.request_sync()
    older = [_registration(i, blocks=2) for i in range(6)]
    newer = [r.model_copy(update={"registered_at": r.registered_at + 1, "router_id": "third"}) for r in older[:3]]
    first = _page(older, next_cursor=6, last_cursor=10)
    await router.on_sync_page(first, MsgTestDouble(""))
    await router.on_sync_page(first, MsgTestDouble(""))  # again: unsolicited
    await router.on_sync_page(_page([*newer, older[4]], router_id="peer2"), MsgTestDouble(""))
    assert len(router.catalog) == 0 and _counter(router, "sync_pages", "unsolicited") == 1
    for after, upto in [(6, 8), (8, None)]:
        await router.on_sync_page(_page([], after=after, upto=upto), MsgTestDouble(""))
    assert router.catalog.snapshot() == _sync_catalog_of(older[3:] + newer)
    assert [router.catalog._residency.donor(r.donor_id).router_id for r in older[:3]] == ["third"] * 3
