"""Session 27: the late replica's add of a 1M-donor sync, in one process (no NATS).

The serving side's pages are built once (as ``bench_replica_sync.py --breakdown`` builds them) and cached in the
temporary directory; the late replica recovers the same blocks (``merge_dump``, which leaves most block maps
mid-rewrite), then decodes the pages and adds them as the handler does (held, sealed, chunk by chunk, the collector
frozen). ``settle``: the maps' rewrites finished first, as the handler now does before a sync's add. ``usearch``: the
replica has a search index (held, as during a sync), so its pipeline step runs too. TREE: the tree to import (a
worktree of an older commit works). Prints the add's CPU, system CPU and page faults.

    python benchmarks/results/session27/late_add.py DONORS none|usearch settle|plain TREE
"""

from __future__ import annotations

import gc
import os
import pickle
import resource
import sys
import tempfile
import time

n, index, mode, tree = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
sys.path[:0] = [tree, tree + "/benchmarks"]

import bench_replica_sync as bench  # noqa: E402

from semblend_dynamo.events.codec import decode, encode  # noqa: E402
from semblend_dynamo.events.schemas import SYNC_PAGE_OVERHEAD, DonorSyncPage, DonorSyncRequest  # noqa: E402
from semblend_dynamo.router.catalog import DonorCatalog  # noqa: E402
from semblend_dynamo.router.gc_freeze import SyncGcFreeze  # noqa: E402
from semblend_dynamo.router.heap import bound_heap_tops  # noqa: E402
from semblend_dynamo.router.sync import HeldPages, build_page  # noqa: E402
from tests.adversarial.router_harness import InProcessRouter  # noqa: E402

cache = os.path.join(tempfile.gettempdir(), f"semblend_late_add_pages_{n}.pkl")
if not os.path.exists(cache):
    peer = DonorCatalog(n + 1000, None, index_dtype="i8")
    for first in range(0, n, bench.CHUNK):
        regs, hashes = bench.registrations(first, min(bench.CHUNK, n - first), "d" * 16)
        peer.add_many(regs)
        peer.apply_kv_events(bench.block_events(first, len(regs), hashes))
    request = DonorSyncRequest(router_id="late", deployment="d" * 16)
    pages, after = [], 0
    while after is not None:
        page = peer.page(after, 4096, max_bytes=(1 << 20) - SYNC_PAGE_OVERHEAD)
        data, _ = build_page(
            page.cursors, page.columns, page.more, request, router_id="peer", deployment="d" * 16,
            last_cursor=peer.last_cursor, max_bytes=1 << 20, encode=encode,
        )  # fmt: skip
        pages.append(data)
        after = page.cursors[-1] if page.more else None
    with open(cache, "wb") as f:
        pickle.dump(pages, f)
    del peer
with open(cache, "rb") as f:
    pages = pickle.load(f)
replica = InProcessRouter(bench.router_config("nats://127.0.0.1:1", index, n + 1000))
late = replica.router.catalog
deployment = replica.deployment
if late.indexer is not None:
    late.indexer.hold(True)  # as the handler holds it while a sync adds
for first in range(0, n, bench.CHUNK):
    count = min(bench.CHUNK, n - first)
    late.merge_dump(bench.block_events(first, count, bench.chunk_hashes(first, count)[1]))
gc.collect()
bound_heap_tops(4 << 20)  # the router's default
settle_s = 0.0
if mode == "settle":
    started = time.process_time()
    late.settle_maps(1 << 40)
    settle_s = time.process_time() - started
freeze, held = SyncGcFreeze(), HeldPages()
before = resource.getrusage(resource.RUSAGE_SELF)
started = time.process_time()
for data in pages:
    rows = decode(data, DonorSyncPage, max_bytes=1 << 20, deployment="d" * 16).rows()
    if held.put(rows) or data is pages[-1]:
        held.seal()
        while (chunk := held.next_chunk()) is not None:
            with freeze.adding(data is not pages[-1]):
                late.add_rows(chunk)
        freeze.page_added(data is not pages[-1])
spent = time.process_time() - started
after = resource.getrusage(resource.RUSAGE_SELF)
assert len(late) == n and bench.resident_count(late) == n
print(
    f"{tree} {index} {mode}: {n:,} donors, add CPU {spent:.2f} s ({spent / n * 1e6:.2f} us a donor; settle first "
    f"{settle_s:.2f} s), system {after.ru_stime - before.ru_stime:.2f} s, page faults {after.ru_minflt - before.ru_minflt}"
)
