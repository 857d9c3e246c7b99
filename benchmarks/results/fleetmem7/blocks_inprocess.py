"""Ad-hoc (fleetmem7): the recovered blocks' maps of a late replica in process, before the sync. ``TREE=<tree>
PYTHONPATH=<tree> python blocks_inprocess.py N``: RSS after ``merge_dump`` of N donors' blocks (the benchmark's
shapes), after ``malloc_trim``, the maps' allocated arrays, and RSS once every base rewrite in progress is finished."""

import ctypes
import gc
import os
import sys

sys.path.insert(0, os.environ["TREE"])
sys.path.insert(0, os.environ["TREE"] + "/benchmarks")
import bench_replica_sync as b

from semblend_dynamo.router.catalog import DonorCatalog

LEVELS = (
    "_keys",
    "_values",
    "_over_keys",
    "_over_values",
    "_frozen_keys",
    "_frozen_values",
    "_next_keys",
    "_next_values",
    "_dir",
    "_next_dir",
    "_live",
    "_frozen_live",
)


def main() -> None:
    n = int(sys.argv[1])
    late = DonorCatalog(n + 1000, None)
    print("empty RSS", b.rss_mb()[0])
    for first in range(0, n, b.CHUNK):
        count = min(b.CHUNK, n - first)
        late.merge_dump(b.block_events(first, count, b.chunk_hashes(first, count)[1]))
    gc.collect()
    print("after blocks RSS", b.rss_mb()[0])
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print("after trim RSS", b.rss_mb()[0])
    total = 0
    maps = [m for blocks in late._residency._workers.values() for m in (blocks.by_block, blocks.hashes)]
    for m in maps:
        for attr in LEVELS:
            a = getattr(m, attr, None)
            if a is not None and hasattr(a, "nbytes"):
                total += (a.base if a.base is not None else a).nbytes
    print(
        f"maps arrays (allocated) {total / 2**20:.0f} MiB; in a rewrite: {sum(bool(len(m._frozen_keys)) for m in maps)}"
    )
    for m in maps:
        m._finish_rewrite()
    gc.collect()
    print("rewrites finished RSS", b.rss_mb()[0])


if __name__ == "__main__":
    main()
