"""Session 24: RSS of a usearch i8 index built by inserts against the same index saved and loaded (VM).

python benchmarks/results/session24/usearch_built_vs_loaded.py 100000
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from usearch.index import Index

DIM = 384


def rss() -> int:
    """VmRSS in bytes, after handing glibc's free heap back."""
    ctypes.CDLL(None).malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def new_index() -> Index:
    return Index(ndim=DIM, metric="cos", dtype="i8", connectivity=16, expansion_add=128, expansion_search=64)


def main(n: int) -> None:
    rng = np.random.default_rng(0)
    codes = np.empty((n, DIM), dtype=np.int8)
    for start in range(0, n, 50_000):
        rows = rng.standard_normal((min(50_000, n - start), DIM)).astype(np.float32)
        codes[start : start + len(rows)] = np.round(rows / np.abs(rows).max(axis=1, keepdims=True) * 127)
    base = rss()
    built = new_index()
    started = time.perf_counter()
    for start in range(0, n, 2048):
        keys = np.arange(start, min(start + 2048, n), dtype=np.uint64)
        built.add(keys, codes[start : start + 2048], threads=0)
    built_bytes, build_s = rss() - base, time.perf_counter() - started
    path = tempfile.mktemp(suffix=".usearch")
    built.save(path)
    file_bytes = os.path.getsize(path)
    del built
    gc.collect()
    base = rss()
    loaded = new_index()
    loaded.load(path)
    loaded_bytes = rss() - base
    os.unlink(path)
    print(
        f"n={n} built {built_bytes / n:.0f} B/donor ({build_s:.0f} s), file {file_bytes / n:.0f} B/donor, "
        f"loaded {loaded_bytes / n:.0f} B/donor ({len(loaded)} donors)"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
