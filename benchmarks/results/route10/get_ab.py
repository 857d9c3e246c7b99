"""U64Map.get per lookup on a map of 800K base + 20K overlay entries, hits and misses, for the tree given (best of 5).

Usage: ``python benchmarks/results/route10/get_ab.py TREE`` (run it for main's tree and this one in turns).
"""

import sys
import timeit

import numpy as np

sys.path.insert(0, sys.argv[1])

from semblend_dynamo.router.u64map import U64Map


def main() -> None:
    rng = np.random.default_rng(0)
    m = U64Map()
    keys = rng.integers(1, 2**63, 800_000, dtype=np.uint64)
    m.set_many(keys.tolist(), list(range(len(keys))))
    list(m.items())  # merged into the base level
    extra = rng.integers(1, 2**63, 20_000, dtype=np.uint64)
    m.set_many(extra.tolist(), list(range(len(extra))))  # a batch: the overlay
    hits = keys[rng.integers(0, len(keys), 2000)].tolist()
    misses = rng.integers(1, 2**63, 2000, dtype=np.uint64).tolist()
    for name, probe in (("hit", hits), ("miss", misses)):
        best = min(timeit.repeat(lambda p=probe: [m.get(k) for k in p], number=5, repeat=5))
        print(f"{sys.argv[1]} {name}: {best / (5 * len(probe)) * 1e6:.2f} us/get")


if __name__ == "__main__":
    main()
