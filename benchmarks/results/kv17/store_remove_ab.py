"""Stored and removed events of one worker's blocks on a bare :class:`Residency`, one tree at a time (session 17, branch
kv17): run it with ``PYTHONPATH`` at each tree, alternating trees, and compare.

The worker holds 200,000 blocks (one event); then, per size (16, 64 and 512 blocks), 300 times: a ``KvStored`` of
fresh blocks with fresh random hashes, then a ``KvRemoved`` of the same blocks, each timed (p50). No donors.

Usage: ``PYTHONPATH=TREE python benchmarks/results/kv17/store_remove_ab.py LABEL``.
"""

import random
import sys
import time

import numpy as np

from semblend_dynamo.events.schemas import KvEvent, KvRemoved, KvStored
from semblend_dynamo.router.residency import Residency


def main() -> None:
    label = sys.argv[1]
    rng = random.Random(1)
    r = Residency(capacity=10)
    held = 200_000
    r.apply(KvEvent(1, 1, KvStored(list(range(10**12, 10**12 + held)), [rng.randrange(1 << 63) for _ in range(held)])))
    next_block, event_id = 1, 2
    for n in (16, 64, 512):
        stores, removes = [], []
        for _ in range(300):
            blocks = list(range(next_block, next_block + n))
            next_block += n
            for data, times in (
                (KvStored(blocks, [rng.randrange(1 << 63) for _ in range(n)]), stores),
                (KvRemoved(blocks), removes),
            ):
                event = KvEvent(1, event_id, data)
                event_id += 1
                t0 = time.perf_counter()
                r.apply(event)
                times.append((time.perf_counter() - t0) * 1e6)
        print(f"{label} {n} blocks: KvStored p50 {np.median(stores):.0f} us, KvRemoved p50 {np.median(removes):.0f} us")


main()
