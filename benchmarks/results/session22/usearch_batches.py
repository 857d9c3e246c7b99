"""How fast the donor index takes a late replica's donors at each insert size: the product's ``DonorIndex`` (usearch,
i8, its HNSW settings), N random unit 384-d vectors over 4 namespaces, inserted ``rows`` at a time per namespace
(the indexer's batch of changes spread over the namespaces). Wall time and donors/s; no other thread running.

    python3 benchmarks/results/session22/usearch_batches.py N ROWS...
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from semblend_dynamo.donor_index import DonorIndex, IndexBackend

n, sizes = int(sys.argv[1]), [int(a) for a in sys.argv[2:]]
rng = np.random.default_rng(7)
vectors = rng.standard_normal((n, 384)).astype(np.float32)
vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
namespaces = [c * 16 for c in "abcd"]
print(f"# {os.cpu_count()} cores, {n:,} donors over {len(namespaces)} namespaces", flush=True)
for rows in sizes:
    index = DonorIndex(384, n + 1000, IndexBackend.USEARCH)
    started = time.perf_counter()
    cpu = time.process_time()
    for first in range(0, n, rows * len(namespaces)):
        for j, namespace in enumerate(namespaces):
            picked = range(first + j, min(n, first + rows * len(namespaces)), len(namespaces))
            if len(picked):
                index.insert_batch(
                    [f"d{i}" for i in picked], namespace, vectors[picked.start : picked.stop : picked.step]
                )
    wall = time.perf_counter() - started
    print(
        f"rows a call {rows}: {wall:.1f} s, {n / wall:,.0f} donors/s, CPU {time.process_time() - cpu:.1f} s",
        flush=True,
    )
