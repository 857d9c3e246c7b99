"""Paired in-process A/B of the late replica's ``DonorCatalog.add_rows`` (ad hoc, for branch fleet4's figures).

On a VM shared with other jobs, two runs one after the other differ by 20-40% in CPU time; here both trees run in one
process and take the same sync pages in turn (page i goes to one tree first when i is even, to the other when odd), so
both see the same load. Python's cyclic GC is off (it is shared by both trees in one process; its cost is measured
by ``bench_replica_sync.py --breakdown`` instead).

The baseline tree's package is imported under another name: ``git archive <ref> semblend_dynamo | tar -x -C DIR &&
mv DIR/semblend_dynamo DIR/semblend_main`` (the package imports itself relatively). Run from the repository root:
``python benchmarks/results/fleet4/paired_add_rows.py --baseline-dir DIR --donors 300000``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--baseline-dir", required=True, help="a directory holding the baseline package as semblend_main")
    p.add_argument("--donors", type=int, default=300_000)
    args = p.parse_args()
    sys.path[:0] = [args.baseline_dir, str(ROOT), str(ROOT / "benchmarks")]
    import bench_replica_sync as b

    from semblend_dynamo.events.codec import encode
    from semblend_dynamo.events.schemas import DonorSyncRequest
    from semblend_dynamo.router.catalog import DonorCatalog
    from semblend_dynamo.router.sync import PageBudget, build_page

    n = args.donors
    peer = DonorCatalog(n + 1000, None)
    for first in range(0, n, b.CHUNK):
        regs, hashes = b.registrations(first, min(b.CHUNK, n - first), "d" * 16)
        peer.add_many(regs)
        peer.apply_kv_events(b.block_events(first, len(regs), hashes))
    request = DonorSyncRequest(router_id="late", deployment="d" * 16)
    pages: list[bytes] = []
    after: int | None = 0
    while after is not None:
        entries, more = peer.page(after, 4096, fits=PageBudget(1 << 20).fits)
        data, _ = build_page(
            entries,
            more,
            request,
            router_id="peer",
            deployment="d" * 16,
            last_cursor=peer.last_cursor,
            max_bytes=1 << 20,
            encode=encode,
        )
        pages.append(data)
        after = entries[-1][0] if more else None
    del peer
    sides = {}
    for name in ("semblend_main", "semblend_dynamo"):
        codec = importlib.import_module(f"{name}.events.codec")
        schemas = importlib.import_module(f"{name}.events.schemas")
        late = importlib.import_module(f"{name}.router.catalog").DonorCatalog(n + 1000, None)
        for first in range(0, n, b.CHUNK):
            count = min(b.CHUNK, n - first)
            hashes = b.chunk_hashes(first, count)[1]
            late.merge_dump(
                [
                    schemas.KvEvent(
                        (first + i) % b.WORKERS,
                        (first + i) // b.WORKERS + 1,
                        schemas.KvStored(
                            list(range((first + i) * b.BLOCKS, (first + i + 1) * b.BLOCKS)), hashes[i].tolist()
                        ),
                    )
                    for i in range(count)
                ]
            )
        rows = [codec.decode(d, schemas.DonorSyncPage, max_bytes=1 << 20, deployment="d" * 16).rows() for d in pages]
        chunks = importlib.import_module(f"{name}.router.handler").sync_chunks
        sides[name] = (late, rows, chunks, [0.0])
    gc.collect()
    gc.disable()
    for i in range(len(pages)):
        for name in ("semblend_main", "semblend_dynamo")[:: 1 if i % 2 else -1]:
            late, rows, chunks, spent = sides[name]
            started = time.process_time()
            for start, stop in chunks(len(rows[i])):
                late.add_rows(rows[i], start, stop)
            spent[0] += time.process_time() - started
    gc.enable()
    for name, (late, _, _, spent) in sides.items():
        assert len(late) == n
        label = "baseline" if name == "semblend_main" else "this tree"
        print(f"{label}: add_rows {spent[0] / n * 1e6:.2f} us a donor ({len(pages)} pages, GC off, pages alternated)")
    snapshots = [sides[name][0].snapshot() for name in sides]
    print(f"catalogs equal: {snapshots[0] == snapshots[1]}; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
