"""Session 25: CPU a serving replica spends building every sync page of its catalog, in process (no NATS).

A replica filled as ``bench_replica_sync.py`` fills replica A (with ``usearch``: its index built, so the catalog's
entries hold no embeddings and pages read them back), then ``catalog.page`` + ``build_page`` until the range is done,
three times; prints µs a donor. TREE is the tree to import (a worktree of an older commit works: its page API is used).

    python benchmarks/results/session25/page_build.py DONORS none|usearch TREE
"""

from __future__ import annotations

import sys
import time

n, index, tree = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.path[:0] = [tree, tree + "/benchmarks"]

import bench_replica_sync as bench  # noqa: E402

from semblend_dynamo.events.codec import encode  # noqa: E402
from semblend_dynamo.events.schemas import DonorSyncRequest  # noqa: E402
from semblend_dynamo.router import sync  # noqa: E402
from tests.adversarial.router_harness import InProcessRouter  # noqa: E402

replica = InProcessRouter(bench.router_config("nats://127.0.0.1:1", index, n + 1000))
catalog = replica.router.catalog
for first in range(0, n, bench.CHUNK):
    regs, hashes = bench.registrations(first, min(bench.CHUNK, n - first), replica.deployment)
    catalog.add_many(regs)
    catalog.apply_kv_events(bench.block_events(first, len(regs), hashes))
if catalog.indexer is not None:
    catalog.drain(900)
request = DonorSyncRequest(router_id="late", deployment=replica.deployment)
common = {"router_id": "peer", "deployment": replica.deployment, "max_bytes": 1 << 20, "encode": encode}


def serve() -> tuple[int, int]:
    after: int | None = 0
    pages = total = 0
    while after is not None:
        if hasattr(sync, "PageBudget"):  # trees before session 25
            entries, more = catalog.page(after, 4096, fits=sync.PageBudget(1 << 20).fits)
            data, _ = sync.build_page(entries, more, request, last_cursor=catalog.last_cursor, **common)
            after = entries[-1][0] if more else None
        else:
            page = catalog.page(after, 4096, max_bytes=(1 << 20) - 1024)
            data, _ = sync.build_page(
                page.cursors, page.columns, page.more, request, last_cursor=catalog.last_cursor, **common
            )
            after = page.cursors[-1] if page.more else None
        pages, total = pages + 1, total + len(data)
    return pages, total


for _ in range(3):
    started = time.process_time()
    pages, total = serve()
    spent = time.process_time() - started
    print(f"{tree} {index}: {pages} pages, {total / pages / 1024:.0f} KiB a page, {spent / n * 1e6:.2f} us a donor")
