"""What usearch itself holds a donor with the product's settings (int8, cosine, M 16, efConstruction 128): RSS growth
of 200K random int8 vectors added in batches of 20K, before and after ``malloc_trim``, and the serialized size.

    python benchmarks/results/session23/usearch_storage.py [N]
"""

import ctypes
import sys

import numpy as np
from usearch.index import Index


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
vectors = np.random.default_rng(0).integers(-127, 127, (n, 384)).astype(np.int8)
before = rss()
index = Index(ndim=384, metric="cos", dtype="i8", connectivity=16, expansion_add=128)
for start in range(0, n, 20_000):
    index.add(np.arange(start, min(n, start + 20_000), dtype=np.uint64), vectors[start : start + 20_000])
grown = rss()
ctypes.CDLL(None).malloc_trim(0)
print(
    f"{n:,} vectors: RSS {(grown - before) / n:.0f} B a vector ({(rss() - before) / n:.0f} after malloc_trim), "
    f"serialized {len(index.save()) / n:.0f} B"
)
