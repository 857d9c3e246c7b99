"""Event-plane selection and the zmq path's reader of Dynamo's KV index."""

from __future__ import annotations

import asyncio
import json

import pytest

from semblend_dynamo.config import ConfigError
from semblend_dynamo.events.schemas import KvEvent, KvStored
from semblend_dynamo.router.kv_ingest import KvIndexFollower, configured_event_plane


def test_event_plane_follows_dynamo_setting() -> None:
    assert configured_event_plane({}) == "zmq"  # Dynamo 1.6's default
    assert configured_event_plane({"DYN_EVENT_PLANE": "NATS"}) == "nats"
    with pytest.raises(ConfigError, match="DYN_EVENT_PLANE='kafka'"):
        configured_event_plane({"DYN_EVENT_PLANE": "kafka"})


class DumpSequence:
    """Test double for ``KvRouter.dump_events``: returns the given dumps in turn (the last one repeats)."""

    def __init__(self, *dumps: str) -> None:
        self.dumps = list(dumps)

    async def dump_events(self) -> str:
        return self.dumps.pop(0) if len(self.dumps) > 1 else self.dumps[0]


def _dump(worker: int, pairs: list[tuple[int, int]]) -> str:
    blocks = [{"block_hash": b, "tokens_hash": t, "mm_extra_info": None} for b, t in pairs]
    event = {"event_id": 0, "data": {"stored": {"parent_hash": None, "start_position": None, "blocks": blocks}}}
    return json.dumps([{"worker_id": worker, "storage_tier": "device", "event": event}])


async def test_follower_hands_every_usable_dump_over_and_counts_bad_ones() -> None:
    seen: list[list[KvEvent]] = []
    errors: list[str] = []
    source = DumpSequence(_dump(7, [(1, 10), (2, 20)]), "not json", _dump(7, [(1, 10)]))
    follower = KvIndexFollower(source, seen.append, interval_s=0.01, on_error=errors.append)
    assert await follower.read_once()
    assert not await follower.read_once()
    follower.start()
    while len(seen) < 3:
        await asyncio.sleep(0.01)
    await follower.close()
    assert errors == ["malformed"]
    first, later = seen[0][0], seen[-1][0]
    assert isinstance(first.data, KvStored) and first.data.tokens_hashes == [10, 20] and first.worker_id == 7
    assert isinstance(later.data, KvStored) and later.data.tokens_hashes == [10]
