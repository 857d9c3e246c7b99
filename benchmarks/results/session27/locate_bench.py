"""Session 27: the block maps' compiled bulk lookup alone: 32 maps of 250K uniform keys (a 1M-donor replica's
maps), each probed with 20 sorted batches of 2,048 of its keys (a sync chunk's hashes on one worker); ns a probe,
five rounds. TREE: the tree to import (its compiled library built).

    python benchmarks/results/session27/locate_bench.py TREE
"""

from __future__ import annotations

import sys
import time

sys.path.insert(0, sys.argv[1])

import numpy as np

from semblend_dynamo.router import u64map

assert u64map.NATIVE_LOCATE is not None, u64map.NATIVE_REASON
rng = np.random.default_rng(1)
maps = []
for _ in range(32):
    keys = np.unique(rng.integers(1, 1 << 64, 250_000, dtype=np.uint64, endpoint=False))
    m = u64map.U64Map()
    m.assign(keys, keys)
    m.arrays()  # everything in the base, with its directory
    maps.append((m, keys))
probes = [[np.sort(rng.choice(keys, 2048)) for _, keys in maps] for _ in range(20)]
rounds = []
for _ in range(5):
    started, n = time.perf_counter(), 0
    for batch in probes:
        for (m, _), probe in zip(maps, batch, strict=True):
            m.lookup(probe)
            n += len(probe)
    rounds.append((time.perf_counter() - started) / n * 1e9)
print(sys.argv[1], "ns a probe:", ", ".join(f"{r:.1f}" for r in rounds))
