"""DonorIndex inserts alone, for one tree: 40K random unit 384-d vectors over 4 namespaces, in batches of 512
(usearch, the product's settings). Run it once per tree, e.g. this one and ``git archive 00e19a7`` extracted to DIR.

    python benchmarks/results/session23/index_insert_ab.py TREE_DIR
"""

import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])

from semblend_dynamo import donor_index
from semblend_dynamo.config import IndexBackend
from semblend_dynamo.donor_index import DonorIndex

n = 40_000
rng = np.random.default_rng(1)
vectors = rng.standard_normal((n, 384)).astype(np.float32)
vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
ids = [f"w{i % 64}-donor-{i:08d}" for i in range(n)]
index = DonorIndex(384, n + 10, IndexBackend.USEARCH)
wall, cpu = time.perf_counter(), time.process_time()
for start in range(0, n, 512):
    index.insert_batch(ids[start : start + 512], "abcd"[(start // 512) % 4] * 16, vectors[start : start + 512])
print(f"{donor_index.__file__}: wall {time.perf_counter() - wall:.1f} s, CPU {time.process_time() - cpu:.1f} s")
