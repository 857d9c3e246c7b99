"""The search index exchange's two sides without NATS: the server's parts of one saved snapshot, the fetch's window,
retries and refusals (end to end over a real nats-server: tests/router/test_sync_replicas.py)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import numpy as np
import pytest

from semblend_dynamo.config import IndexBackend
from semblend_dynamo.donor_index import DonorIndex, usearch_available
from semblend_dynamo.events.schemas import IndexSnapshotPart
from semblend_dynamo.index_snapshot import file_digest
from semblend_dynamo.router import index_sync
from semblend_dynamo.router.index_sync import SnapshotFetch, SnapshotServer

pytestmark = pytest.mark.skipif(not usearch_available(), reason="usearch not installed")
PART = 4096


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _index(donors: int = 200) -> DonorIndex:
    index = DonorIndex(16, 1000, IndexBackend.USEARCH)
    rows = np.random.default_rng(1).standard_normal((donors, 16)).astype(np.float32)
    if donors:
        index.insert_batch([f"d{i}" for i in range(donors)], "ns", rows)
    return index


def _files(directory: Path) -> list[str]:
    return sorted(p.name.split("-")[1] for p in directory.iterdir())


async def test_the_server_saves_one_snapshot_sends_it_in_parts_and_deletes_it_once_unasked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(index_sync, "SNAPSHOT_TTL_S", 0.2)
    clock = Clock()
    server = SnapshotServer(_index(), router_id="a", deployment="dep", clock=clock)
    first, outcome = await server.part(None, 0, PART)
    assert outcome == "saved" and first.part == 0 and first.snapshot is not None and first.parts >= 2
    again, outcome = await server.part(None, 0, PART)  # within REUSE_S: the same snapshot, not saved again
    assert outcome == "sent" and again.snapshot == first.snapshot and server.saves == 1
    data = b"".join([(await server.part(first.snapshot, i, PART))[0].data for i in range(first.parts)])
    (tmp_path / "copy").write_bytes(data)
    assert len(data) == first.size and file_digest(tmp_path / "copy") == first.snapshot
    for snapshot, part in ((first.snapshot, first.parts), ("0" * 32, 0)):
        reply, outcome = await server.part(snapshot, part, PART)
        assert (reply.parts, reply.data, outcome) == (0, b"", "unknown")
    (tmp_path / "copy").unlink()
    assert _files(tmp_path) == ["index"]
    clock.now += 1.0  # no peer asked for longer than the TTL: deleted
    await asyncio.sleep(0.3)
    assert not server.holding and _files(tmp_path) == []
    reply, outcome = await server.part(first.snapshot, 0, PART)
    assert reply.parts == 0 and outcome == "unknown"
    clock.now += 100.0
    reply, outcome = await server.part(None, 0, PART)  # asked again later: a new one
    assert outcome == "saved" and server.saves == 2
    server.close()
    assert _files(tmp_path) == []


async def test_a_server_with_nothing_to_save_answers_with_no_snapshot(tmp_path: Path) -> None:
    server = SnapshotServer(_index(0), router_id="a", deployment="dep")
    reply, outcome = await server.part(None, 0, PART)
    assert (reply.parts, reply.snapshot, outcome) == (0, None, "empty")


async def _parts(tmp_path: Path) -> list[IndexSnapshotPart]:
    server = SnapshotServer(_index(), router_id="peer", deployment="dep")
    first, _ = await server.part(None, 0, PART)
    parts = [first] + [(await server.part(first.snapshot, i, PART))[0] for i in range(1, first.parts)]
    server.close()
    return parts


async def test_the_fetch_keeps_its_window_writes_each_part_in_place_and_ignores_what_it_did_not_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parts = await _parts(tmp_path)
    fetch = SnapshotFetch("peer", max_size=1 << 20, window=3)
    assert fetch.accept(parts[1]) is None  # before the first part: not asked
    assert fetch.accept(parts[0]) == [1, 2, 3]
    assert fetch.accept(parts[0]) is None and fetch.accept(parts[4]) is None  # again / beyond the window
    stranger = parts[1].model_copy(update={"router_id": "stranger"})
    assert fetch.accept(stranger) is None
    asked = {1, 2, 3}
    for part in reversed(parts[1:4]):  # out of order
        asked |= set(fetch.accept(part) or [])
    while not fetch.complete:
        (nxt,) = [p for p in sorted(fetch.outstanding)][:1]
        asked |= set(fetch.accept(parts[nxt]) or [])
    assert asked == set(range(1, len(parts))) and fetch.failed is None
    assert fetch.path is not None and file_digest(fetch.path) == parts[0].snapshot
    fetch.close()
    assert [p for p in tmp_path.iterdir() if p.name.startswith("semblend-peer")] == []


async def test_a_quiet_peer_is_asked_again_then_given_up_and_refusals_end_the_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parts = await _parts(tmp_path)
    clock = Clock()
    fetch = SnapshotFetch("peer", max_size=1 << 20, window=2, clock=clock)
    assert fetch.overdue(2.0, 2) == []
    clock.now += 2.0
    assert fetch.overdue(2.0, 2) == [0]  # the first part asked again
    assert fetch.accept(parts[0]) == [1, 2]
    for _ in range(2):
        clock.now += 2.0
        assert fetch.overdue(2.0, 2) == [1, 2]
    clock.now += 2.0
    assert fetch.overdue(2.0, 2) == [] and fetch.failed == "abandoned"
    assert fetch.accept(parts[1]) is None
    fetch.close()

    too_large = SnapshotFetch("peer", max_size=parts[0].size - 1)
    assert too_large.accept(parts[0]) is None and too_large.failed == "too_large" and too_large.path is None
    none = SnapshotFetch("peer", max_size=1 << 20)
    assert none.accept(IndexSnapshotPart(router_id="peer", deployment="dep")) is None and none.failed == "none"
    gone = SnapshotFetch("peer", max_size=1 << 20)
    assert gone.accept(parts[0]) == [1, 2, 3, 4, 5, 6, 7, 8][: len(parts) - 1]
    assert gone.accept(IndexSnapshotPart(router_id="peer", deployment="dep")) is None and gone.failed == "gone"
    gone.close()
    assert [p for p in tmp_path.iterdir() if p.name.startswith("semblend-peer")] == []


def test_a_part_whose_fields_disagree_does_not_decode() -> None:
    fields = {"router_id": "p", "deployment": "d", "snapshot": "a" * 32, "parts": 2, "part_bytes": 1024, "size": 1500}
    IndexSnapshotPart(**fields, part=1, data=b"x" * 476)
    for bad in (
        {"part": 2, "data": b""},  # past the end
        {"part": 0, "data": b"x" * 1000},  # not the part's bytes
        {"parts": 3, "part": 0, "data": b"x" * 1024},  # parts disagree with size
    ):
        with pytest.raises(ValueError):
            IndexSnapshotPart(**(fields | bad))
    with pytest.raises(ValueError):
        IndexSnapshotPart(router_id="p", deployment="d", data=b"x")  # no snapshot carries no data
