"""Residency at 50K resident donors (16 blocks each, one worker: 800K block-map entries): a donor added at capacity
(it evicts the oldest) and a kv-event removing one donor's blocks, timed per call.

Usage: ``python residency_churn.py TREE`` (a source tree to import, e.g. a ``git archive`` of a commit).
"""

import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])

from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvRemoved, KvStored
from semblend_dynamo.router.residency import Residency

N = 50_000


def registration(i: int, hashes: list[list[int]], embedding: str, dim: int, worker_id: int = 1) -> DonorRegistration:
    """Donor ``d<i>`` of 16 blocks (``hashes[i]``) on ``worker_id``."""
    return DonorRegistration(
        donor_id=f"d{i}",
        worker_id=worker_id,
        deployment="d",
        namespace="ns",
        num_tokens=512,
        block_size=32,
        block_hashes=hashes[i],
        embedding=embedding,
        embedding_dim=dim,
    )


def report(label: str, seconds: list[float]) -> None:
    ms = np.array(seconds) * 1e3
    print(f"{label}: p50 {np.percentile(ms, 50):.3f} ms p99 {np.percentile(ms, 99):.2f} max {ms.max():.2f}")


def main() -> None:
    residency = Residency(N)
    hashes = np.random.default_rng(0).integers(1, 1 << 62, size=(N + 600, 16)).tolist()
    embedding, dim = DonorRegistration.pack_embedding(np.ones(8, dtype=np.float32) / 8**0.5)
    residency.add_many([registration(i, hashes, embedding, dim) for i in range(N)])
    for i in range(N):
        residency.apply(KvEvent(1, i + 1, KvStored([(i << 8) + j for j in range(16)], hashes[i])))
    added = []
    for i in range(N, N + 300):  # each new donor evicts the oldest (capacity N)
        new = registration(i, hashes, embedding, dim)
        t0 = time.perf_counter()
        residency.add_donor(new)
        residency.apply(KvEvent(1, i + 1, KvStored([(i << 8) + j for j in range(16)], hashes[i])))
        added.append(time.perf_counter() - t0)
    report("add+store a donor at capacity (evicts one)", added)
    removed = []
    for i in range(300, 600):  # the engine evicts old donors' blocks
        t0 = time.perf_counter()
        residency.apply(KvEvent(1, 10**7 + i, KvRemoved([(i << 8) + j for j in range(16)])))
        removed.append(time.perf_counter() - t0)
    report("kv-event removing one donor's 16 blocks", removed)


if __name__ == "__main__":
    main()
