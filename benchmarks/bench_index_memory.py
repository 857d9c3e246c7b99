"""Donor index memory per donor by usearch vector storage and HNSW settings (the search index alone).

Each configuration runs in a fresh process: an empty :class:`~semblend_dynamo.donor_index.DonorIndex` (usearch backend,
one namespace) takes ``N`` clustered 384-d unit vectors (``bench_donor_search``'s data) in batches of 10,000, and the
process's RSS growth per donor against the empty index is reported, with the part that is usearch's native index
(RSS growth after ``malloc_trim`` minus the Python heap growth ``tracemalloc`` counts: the index's id maps;
tracemalloc's own tables are left out of both). Vectors are generated per batch and dropped, as a replica decodes and drops sync pages.

Usage: ``python -m benchmarks.bench_index_memory --donors 100000 --dtypes f16,i8 --connectivity 16,8``
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import time
import tracemalloc
from typing import cast, get_args

import numpy as np

from benchmarks.bench_catalog_memory import rss_bytes
from benchmarks.bench_donor_search import DIM, NS, clustered
from semblend_dynamo.config import IndexBackend
from semblend_dynamo.donor_index import DonorIndex, VectorDtype

BATCH = 10_000


def measure(n: int, dtype: VectorDtype, connectivity: int, expansion_add: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((1000, 48)).astype(np.float32)
    proj = rng.standard_normal((48, DIM)).astype(np.float32)
    index = DonorIndex(
        DIM, n + 16, IndexBackend.USEARCH, connectivity=connectivity, expansion_add=expansion_add, dtype=dtype
    )
    gc.collect()
    tracemalloc.start()
    empty_rss, empty_overhead = rss_bytes(), tracemalloc.get_tracemalloc_memory()
    started = time.perf_counter()
    for first in range(0, n, BATCH):
        count = min(BATCH, n - first)
        index.insert_batch([f"donor-{first + i:08d}" for i in range(count)], NS, clustered(count, rng, centers, proj))
    seconds = time.perf_counter() - started
    gc.collect()
    heap = tracemalloc.get_traced_memory()[0]
    overhead = tracemalloc.get_tracemalloc_memory() - empty_overhead
    rss = rss_bytes() - empty_rss - overhead
    ctypes.CDLL(None).malloc_trim(0)  # glibc: hand freed heap pages (the batches' float32 copies) back to the OS
    trimmed = rss_bytes() - empty_rss - overhead
    tracemalloc.stop()
    return {
        "donors": n,
        "dtype": dtype,
        "connectivity": connectivity,
        "expansion_add": expansion_add,
        "rss_bytes_per_donor": rss / n,
        "trimmed_rss_bytes_per_donor": trimmed / n,
        "python_heap_bytes_per_donor": heap / n,
        "native_bytes_per_donor": (trimmed - heap) / n,
        "build_s": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", default="100000", help="comma-separated donor counts")
    parser.add_argument("--dtypes", default="f16,i8", help="comma-separated usearch vector storages")
    parser.add_argument("--connectivity", default="16", help="comma-separated HNSW M values")
    parser.add_argument("--expansion-add", default="128", help="comma-separated HNSW efConstruction values")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dtypes = cast(list[VectorDtype], args.dtypes.split(","))
    if not set(dtypes) <= set(get_args(VectorDtype)):
        parser.error(f"--dtypes {args.dtypes!r}: each must be one of {', '.join(get_args(VectorDtype))}")
    if args.child:
        print(json.dumps(measure(int(args.donors), dtypes[0], int(args.connectivity), int(args.expansion_add))))
        return 0
    print("| donors | storage | M | efConstruction | RSS B/donor | after malloc_trim | Python heap B/donor | "
          "usearch (trimmed RSS - heap) B/donor | build s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.donors.split(","):
        for m in args.connectivity.split(","):
            for ef in args.expansion_add.split(","):
                for dtype in dtypes:
                    cmd = [sys.executable, "-m", "benchmarks.bench_index_memory", "--child", "--donors", n]
                    cmd += ["--dtypes", dtype, "--connectivity", m, "--expansion-add", ef]
                    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                    print(
                        f"| {r['donors']:,} | {r['dtype']} | {r['connectivity']} | {r['expansion_add']} | "
                        f"{r['rss_bytes_per_donor']:,.0f} | {r['trimmed_rss_bytes_per_donor']:,.0f} | "
                        f"{r['python_heap_bytes_per_donor']:,.0f} | "
                        f"{r['native_bytes_per_donor']:,.0f} | {r['build_s']:.1f} |",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
