"""Replicas started late converge on a real nats-server: the same donors and the same resident sets as their peers."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import numpy as np
import pytest

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.donor_index import usearch_available
from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored
from semblend_dynamo.router import handler as handler_module
from tests.adversarial.router_harness import InProcessRouter, router_config
from tests.support.nats import NatsServer

pytestmark = pytest.mark.nats

DONORS = 2000
WORKERS = 8
BLOCKS = 16
NAMESPACES = ("a" * 16, "b" * 16)


def fleet(deployment: str, dim: int, donors: int = DONORS) -> tuple[list[DonorRegistration], list[KvEvent]]:
    """Registrations on 8 workers and the workers' stored blocks; every 10th donor misses a block (not resident)."""
    rng = np.random.default_rng(7)
    hashes = rng.integers(1, 1 << 63, size=(donors, BLOCKS), dtype=np.int64)
    vectors = rng.standard_normal((donors, dim)).astype("<f2")
    registrations = [
        DonorRegistration(
            donor_id=f"w{i % WORKERS}-d{i:05d}",
            donor_key=f"{i:016x}",
            router_id="fleet-peer",
            worker_id=i % WORKERS,
            dp_rank=i % 2,
            deployment=deployment,
            namespace=NAMESPACES[i % 3 == 0],
            num_tokens=BLOCKS * 32 + i,
            block_size=32,
            block_hashes=hashes[i].tolist(),
            embedding=vectors[i].tobytes(),
            embedding_dim=dim,
            registered_at=1000.0 + i,
        )
        for i in range(donors)
    ]
    events = []
    for i, r in enumerate(registrations):
        stored = r.block_hashes[: BLOCKS - 1] if i % 10 == 0 else r.block_hashes
        blocks = [i * BLOCKS + b for b in range(len(stored))]
        events.append(KvEvent(r.worker_id, i // WORKERS + 1, KvStored(blocks, stored), dp_rank=r.dp_rank))
    return registrations, events


def state(replica: InProcessRouter) -> tuple[list[dict[str, object]], dict[str, set[str]], set[str]]:
    """Catalog (ids, workers, namespaces, blocks, residency), resident sets and the pipeline's donors."""
    catalog, discovery = replica.router.catalog, replica.discovery
    assert discovery is not None and discovery.index is not None
    return (
        catalog.snapshot(),
        {ns: catalog.resident(ns) for ns in NAMESPACES},
        {d["donor_id"] for d in catalog.snapshot() if d["donor_id"] in discovery.index},  # type: ignore[operator]
    )


async def converged(late: InProcessRouter, peer: InProcessRouter, timeout: float = 60.0) -> None:
    want = state(peer)
    for _ in range(int(timeout / 0.05)):
        if len(late.router.catalog) == len(want[0]) and state(late) == want:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"late replica holds {len(late.router.catalog)} of {len(want[0])} donors")


async def serving(cfg: SemblendConfig, donors: int) -> tuple[InProcessRouter, list[KvEvent]]:
    """A replica holding ``donors`` of :func:`fleet`, all applied to its pipeline; and their workers' blocks."""
    a = await InProcessRouter(cfg).start()
    assert a.discovery is not None and a.discovery.index is not None
    registrations, events = fleet(a.deployment, a.discovery.index.dim, donors=donors)
    a.router.catalog.apply_kv_events(events)
    a.router.catalog.add_many(registrations)
    assert a.router.catalog.drain(10)
    return a, events


async def started_late(cfg: SemblendConfig, events: list[KvEvent]) -> InProcessRouter:
    """A replica that recovers the workers' blocks, then starts (and syncs)."""
    late = InProcessRouter(cfg)
    late.router.catalog.merge_dump(events)
    return await late.start()


needs_usearch = pytest.mark.skipif(not usearch_available(), reason="usearch not installed")


@pytest.fixture
def usearch_cfg(nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SemblendConfig:
    """Replicas with usearch indexes; temporary files (saved and fetched indexes) go to ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return router_config(nats_server.url, index_capacity=4096, index_backend="usearch", sync_window=4)


async def test_late_replicas_end_with_the_peers_donors_and_resident_sets(nats_server: NatsServer) -> None:
    cfg = router_config(nats_server.url, index_capacity=4096, sync_window=4)  # 64 KB messages: ~60 donors a page
    a = await InProcessRouter(cfg).start()
    assert a.discovery is not None and a.discovery.index is not None
    registrations, events = fleet(a.deployment, a.discovery.index.dim)
    a.router.catalog.apply_kv_events(events)
    for registration in registrations:
        a.router.catalog.add(registration)
    assert a.router.catalog.drain(10)
    snapshot, resident, indexed = state(a)
    assert len(snapshot) == DONORS and sum(map(len, resident.values())) == DONORS - DONORS // 10
    assert indexed == set().union(*resident.values())

    b = InProcessRouter(cfg)
    b.router.catalog.merge_dump(events)  # the blocks a late replica recovers from Dynamo's KV index
    await b.start()
    await converged(b, a)
    assert b.router.catalog.indexer is not None and not b.router.catalog.indexer.held  # released once synced
    c = InProcessRouter(cfg)
    c.router.catalog.merge_dump(events)
    await c.start()
    await converged(c, a)
    assert state(b) == state(c) == state(a)

    assert a.metrics.sync_replies._value.get() > 2 * cfg.sync_window  # many pages, over every lane
    assert b.metrics.sync_peers.labels("done")._value.get() == 1
    for _ in range(200):  # C holds everything from the first peer; the second one's pages may still be arriving
        if c.metrics.sync_peers.labels("done")._value.get() == 2:
            break
        await asyncio.sleep(0.05)
    assert c.metrics.sync_peers.labels("done")._value.get() == 2  # both peers answered and were synced
    assert state(c) == state(a)
    for replica in (a, b, c):
        assert replica.rejected("donors_sync", "rate_limited") == 0
        assert replica.rejected("sync_pages", "unsolicited") == 0
    for replica in (a, b, c):
        await replica.close()


async def test_requests_refused_by_the_rate_limit_are_asked_again_until_the_replica_converges(
    nats_server: NatsServer,
) -> None:
    cfg = router_config(nats_server.url, index_capacity=4096, sync_window=4)
    a, events = await serving(cfg.model_copy(update={"sync_rate_per_s": 2.0}), 250)  # a burst of 2 for 4 lanes
    b = await started_late(cfg, events)
    await converged(b, a)
    assert a.rejected("donors_sync", "rate_limited") > 0
    assert b.metrics.sync_peers.labels("done")._value.get() == 1
    for replica in (a, b):
        await replica.close()


def _temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("semblend-"))


@needs_usearch
async def test_a_late_replica_loads_its_peers_search_index_whole_and_ends_with_the_same_donors(
    usearch_cfg: SemblendConfig, tmp_path: Path
) -> None:
    """B's pipeline is empty when it starts, so it fetches A's usearch index in parts (64 KB messages) and loads it
    instead of inserting 1,800 donors one by one; every add of the sync is then confirmed, none inserted again. C,
    started with snapshots off, indexes them one by one and ends the same."""
    cfg = usearch_cfg
    a, events = await serving(cfg, DONORS)
    indexed = len(state(a)[2])

    b = await started_late(cfg, events)
    await converged(b, a)  # as soon as it is loaded; the sync's adds follow
    assert await asyncio.to_thread(b.router.catalog.drain, 30)
    assert b.metrics.index_snapshots.labels("fetched", "loaded")._value.get() == 1
    assert a.metrics.index_snapshots.labels("served", "saved")._value.get() == 1
    indexer = b.router.catalog.indexer
    assert indexer is not None and indexer.counters["snapshot_confirmed"] == indexed
    assert indexer.counters["snapshot_pruned"] == 0 and not indexer.held
    # A keeps its snapshot for the next peer a while; B's fetched copy is gone
    assert [name.split("-")[1] for name in _temp_files(tmp_path)] == ["index"]

    c = await started_late(cfg.model_copy(update={"sync_index_snapshots": False}), events)
    await converged(c, a)
    assert c.metrics.index_snapshots.labels("fetched", "loaded")._value.get() == 0
    c_indexer = c.router.catalog.indexer
    assert c_indexer is not None and c_indexer.counters["snapshot_confirmed"] == 0
    assert state(c) == state(b) == state(a)
    for replica in (a, b, c):
        assert replica.rejected("sync_pages", "unsolicited") == 0
        await replica.close()
    assert _temp_files(tmp_path) == []


@needs_usearch
async def test_a_peer_that_sends_no_index_leaves_the_sync_to_index_every_donor(
    usearch_cfg: SemblendConfig, tmp_path: Path
) -> None:
    cfg = usearch_cfg
    a, events = await serving(cfg.model_copy(update={"sync_index_snapshots": False}), 300)
    b = await started_late(cfg, events)
    await converged(b, a)
    assert b.metrics.index_snapshots.labels("fetched", "none")._value.get() == 1
    assert a.metrics.index_snapshots.labels("served", "disabled")._value.get() == 1
    for replica in (a, b):
        await replica.close()
    assert _temp_files(tmp_path) == []


@needs_usearch
async def test_a_peer_that_never_sends_its_index_is_given_up_and_the_sync_indexes_every_donor(
    usearch_cfg: SemblendConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A answers the sync but drops every request for its index (a test double of a peer that went quiet): B asks
    again, gives the fetch up, lets its indexer go and indexes the sync's donors one by one."""
    monkeypatch.setattr(handler_module, "REPLY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(handler_module, "RETRIES", 2)
    cfg = usearch_cfg
    a, events = await serving(cfg, 300)

    async def quiet(event: object, msg: object) -> None:
        return None

    monkeypatch.setattr(a.router, "_on_snapshot_request", quiet)
    b = await started_late(cfg, events)
    await converged(b, a)
    assert await asyncio.to_thread(b.router.catalog.drain, 30)
    assert b.metrics.index_snapshots.labels("fetched", "abandoned")._value.get() == 1
    assert b.metrics.events_out.labels("indexsnap")._value.get() == 3  # asked, then again twice
    assert b.router.catalog.indexer is not None and not b.router.catalog.indexer.held
    assert state(b) == state(a)
    for replica in (a, b):
        await replica.close()
    assert _temp_files(tmp_path) == []
