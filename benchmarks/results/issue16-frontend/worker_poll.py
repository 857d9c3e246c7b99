"""What the router's discovery poll (every 0.5 s, on the event loop) and a metrics scrape cost with 100K donors
on two workers: ``Residency.retain_workers`` with the same live workers, and ``donors_per_worker``.

Usage: ``python worker_poll.py TREE`` (a source tree to import, e.g. a ``git archive`` of a commit).
"""

import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])

from residency_churn import registration  # beside this script

from semblend_dynamo.events.schemas import DonorRegistration
from semblend_dynamo.router.residency import Residency

N = 100_000


def main() -> None:
    residency = Residency(N)
    hashes = np.random.default_rng(0).integers(1, 1 << 62, size=(N, 16)).tolist()
    embedding, dim = DonorRegistration.pack_embedding(np.ones(8, dtype=np.float32) / 8**0.5)
    residency.add_many([registration(i, hashes, embedding, dim, worker_id=1 + i % 2) for i in range(N)])
    for name, call in (
        ("retain_workers (no change)", lambda: residency.retain_workers({1, 2})),
        ("donors_per_worker", residency.donors_per_worker),
    ):
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        ms = np.array(times) * 1e3
        print(f"{name}: p50 {np.percentile(ms, 50):.3f} ms max {ms.max():.3f} ms")


main()
