"""Ad-hoc (fleet7): the late replica's in-process sync path on the tree in $TREE: decode, rows, held add (as the
handler holds and adds pages, GC frozen after each add), CPU µs a donor, and RSS growth a donor over the recovered
blocks. ``python inprocess_ab.py N [PROFILE_FILE]`` with TREE=<a tree> PYTHONPATH=<the same tree>; pages are built
once per N by the peer's code of the first tree run and cached in /tmp/f7/pages_N.pkl (the wire format is the same).
``--trace`` instead: the Python heap the sync adds a donor, by line (tracemalloc)."""

import gc
import os
import pickle
import sys
import time

sys.path.insert(0, os.environ["TREE"])
sys.path.insert(0, os.environ["TREE"] + "/benchmarks")
import bench_replica_sync as b

from semblend_dynamo.events.codec import decode, encode
from semblend_dynamo.events.schemas import DonorSyncPage, DonorSyncRequest
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.gc_freeze import SyncGcFreeze
from semblend_dynamo.router.sync import HeldPages, PageBudget, build_page


def pages_of(n: int) -> list[bytes]:
    cache = f"/tmp/f7/pages_{n}.pkl"
    if os.path.exists(cache):
        with open(cache, "rb") as f:
            return pickle.load(f)
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
    os.makedirs("/tmp/f7", exist_ok=True)
    with open(cache, "wb") as f:
        pickle.dump(pages, f)
    return pages


def main() -> None:
    n = int(sys.argv[1])
    trace = "--trace" in sys.argv
    prof = next((a for a in sys.argv[2:] if not a.startswith("--")), None)
    pages = pages_of(n)
    late = DonorCatalog(n + 1000, None)
    for first in range(0, n, b.CHUNK):
        count = min(b.CHUNK, n - first)
        late.merge_dump(b.block_events(first, count, b.chunk_hashes(first, count)[1]))
    gc.collect()
    rss0 = b.rss_mb()[0]
    if trace:
        import tracemalloc

        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
    freeze, held = SyncGcFreeze(), HeldPages()
    profiler = None
    if prof:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
    spent = {"decode": 0.0, "rows": 0.0, "add": 0.0}
    for data in pages:
        t0 = time.process_time()
        page = decode(data, DonorSyncPage, max_bytes=1 << 20, deployment="d" * 16)
        t1 = time.process_time()
        rows = page.rows()
        t2 = time.process_time()
        if held.put(rows) or data is pages[-1]:
            held.seal()
            while (chunk := held.next_chunk()) is not None:
                late.add_rows(chunk)
            freeze.page_added(data is not pages[-1])
        t3 = time.process_time()
        spent["decode"] += t1 - t0
        spent["rows"] += t2 - t1
        spent["add"] += t3 - t2
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(prof)
    assert len(late) == n and b.resident_count(late) == n
    del page, rows, data, pages
    gc.collect()
    if trace:
        stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
        print(f"{n:,} donors: Python heap the sync added {sum(s.size_diff for s in stats) / n:.0f} B a donor")
        for s in stats[:8]:
            print(f"  {s.size_diff / n:7.1f} B {s.count_diff / n:5.2f} objects a donor  {s.traceback}")
        return
    rss1 = b.rss_mb()[0]
    total = sum(spent.values())
    print(
        f"{n:,} donors: CPU µs a donor "
        + ", ".join(f"{k} {v / n * 1e6:.2f}" for k, v in spent.items())
        + f", total {total / n * 1e6:.2f}; RSS {rss0:.0f} -> {rss1:.0f} MiB ({(rss1 - rss0) * 1048576 / n:,.0f} B a donor)"
    )


if __name__ == "__main__":
    main()
