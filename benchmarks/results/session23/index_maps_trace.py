"""The Python heap a donor costs in a catalog with a usearch index, by line (tracemalloc), once the indexer caught up
(bench_catalog_memory's registrations and kv-events, 64 workers).

    python benchmarks/results/session23/index_maps_trace.py 100000
"""

import gc
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import bench_catalog_memory as memory
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.embedder import HashEmbedder
from semblend_dynamo.pipeline import DonorDiscovery
from semblend_dynamo.router.catalog import DonorCatalog


def main(n: int) -> None:
    tracemalloc.start(1)
    cfg = SemblendConfig(index_capacity=n + 16, index_dtype="i8", index_backend="usearch")
    discovery = DonorDiscovery.from_config(cfg, embedder=HashEmbedder(), background=False)
    catalog = DonorCatalog(n + 16, discovery)
    gc.collect()
    before = tracemalloc.take_snapshot()
    memory.fill(catalog, n, one_by_one=False)
    catalog.drain()
    gc.collect()
    stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
    print(f"{n:,} donors: Python heap {sum(s.size_diff for s in stats) / n:.0f} B a donor; by line:")
    for stat in stats[:20]:
        frame = stat.traceback[0]
        where = frame.filename.split(str(Path(__file__).resolve().parents[3]) + "/")[-1]
        print(f"{stat.size_diff / n:8.1f} B  {stat.count_diff / n:5.2f} objects  {where}:{frame.lineno}")
    catalog.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
