"""Ad-hoc: the late replica's add (held pages, GC off) with ADD_CHUNK 2048 and 1024 alternately, the same pages, in one
process. Usage: python benchmarks/results/fleet5/chunk_sizes.py 300000"""

import gc
import sys
import time
from pathlib import Path

from semblend_dynamo.events.codec import decode, encode
from semblend_dynamo.events.schemas import DonorSyncPage, DonorSyncRequest
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.sync import HeldPages, PageBudget, build_page

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_replica_sync as b

n = int(sys.argv[1])
peer = DonorCatalog(n + 1000, None)
for first in range(0, n, b.CHUNK):
    regs, hashes = b.registrations(first, min(b.CHUNK, n - first), "d" * 16)
    peer.add_many(regs)
    peer.apply_kv_events(b.block_events(first, len(regs), hashes))
request = DonorSyncRequest(router_id="late", deployment="d" * 16)
pages, after = [], 0
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
for chunk in (2048, 1024, 2048, 1024):
    late = DonorCatalog(n + 1000, None)
    for first in range(0, n, b.CHUNK):
        count = min(b.CHUNK, n - first)
        late.merge_dump(b.block_events(first, count, b.chunk_hashes(first, count)[1]))
    gc.collect()
    gc.disable()
    held = HeldPages(chunk=chunk)
    add = worst = 0.0
    for data in pages:
        rows = decode(data, DonorSyncPage, max_bytes=1 << 20, deployment="d" * 16).rows()
        if held.put(rows) or data is pages[-1]:
            held.seal()
            while (part := held.next_chunk()) is not None:
                t = time.process_time()
                late.add_rows(part)
                dt = time.process_time() - t
                add += dt
                worst = max(worst, dt)
    gc.enable()
    print(f"chunk {chunk}: add_rows {add / n * 1e6:.2f} us a donor, longest chunk {worst * 1e3:.1f} ms", flush=True)
    del late
    gc.collect()
