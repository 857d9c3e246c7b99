"""Block maps left mid-rewrite: a catalog of N donors (bench_catalog_memory's registrations and kv-events, 64 workers,
no search index), then its maps settled as the router's loop settles them (``DonorCatalog.settle_maps``, 65,536
entries a step), with RSS per donor before and after (each after ``malloc_trim``) and the steps' times.

    python benchmarks/results/session23/settle_maps.py [DONORS]
"""

import ctypes
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import bench_catalog_memory as memory
from semblend_dynamo.router.catalog import DonorCatalog


def trimmed_rss() -> int:
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    return memory.rss_bytes()


def main(n: int) -> None:
    catalog = DonorCatalog(n + 16, None, index_dtype="i8")
    empty = trimmed_rss()
    memory.fill(catalog, n, one_by_one=False)
    maps = [m for blocks in catalog._residency._workers.values() for m in (blocks.by_block, blocks.hashes)]
    entries = sum(len(m) for m in maps)

    def held() -> float:  # bytes of the maps' arrays a donor (an array's whole allocation where it is a slice)
        arrays = (
            "_keys",
            "_values",
            "_over_keys",
            "_over_values",
            "_live",
            "_frozen_keys",
            "_frozen_values",
            "_frozen_live",
            "_next_keys",
            "_next_values",
        )
        total = 0
        for m in maps:
            for name in arrays:
                a = getattr(m, name)
                total += (a.base if a.base is not None else a).nbytes
        return total / n

    before, mid, arrays_before = trimmed_rss(), sum(m.rewriting for m in maps), held()
    steps = []
    while True:
        t = time.perf_counter()
        settled = catalog.settle_maps(65_536)
        steps.append(time.perf_counter() - t)
        assert settled is not None
        if not settled[1]:
            break
    after = trimmed_rss()
    steps.sort()
    print(f"{n:,} donors, {len(maps)} maps, {entries:,} entries ({entries * 16 / n:.0f} B a donor at 16 B an entry)")
    print(
        f"before: {mid} maps mid-rewrite, arrays {arrays_before:.0f} B a donor, RSS {(before - empty) / n:.0f} B a donor"
    )
    print(f"settled: arrays {held():.0f} B a donor, RSS {(after - empty) / n:.0f} B a donor")
    print(
        f"{len(steps)} steps, {sum(steps) * 1e3:.0f} ms in all, p50 {steps[len(steps) // 2] * 1e3:.2f} ms, "
        f"longest {steps[-1] * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300_000)
