"""Where ``Residency._store_new``'s array path starts to pay (session 17, branch kv17): a bare residency (200K blocks
held, no donors), 2,000 ``KvStored`` events of fresh blocks a size timed (p50), with the array path for every size
(``_ARRAY_STORE`` set to 1) against the general path (``_store_new`` declining), alternating.

Usage: ``python benchmarks/results/kv17/threshold.py`` (this tree).
"""

import random
import time

import numpy as np

from semblend_dynamo.events.schemas import KvEvent, KvStored
from semblend_dynamo.router import residency
from semblend_dynamo.router.residency import Residency


class General(Residency):
    def _store_new(self, *args: object) -> bool:
        return False


def p50(cls: type[Residency], n: int, rng: random.Random) -> float:
    r = cls(capacity=10)
    held = 200_000
    r.apply(KvEvent(1, 1, KvStored(list(range(10**12, 10**12 + held)), [rng.randrange(1 << 63) for _ in range(held)])))
    times = []
    for i in range(2000):
        event = KvEvent(1, 2 + i, KvStored(list(range(i * n, (i + 1) * n)), [rng.randrange(1 << 63) for _ in range(n)]))
        t0 = time.perf_counter()
        r.apply(event)
        times.append((time.perf_counter() - t0) * 1e6)
    return float(np.median(times))


def main() -> None:
    residency._ARRAY_STORE = 1
    rng = random.Random(1)
    for n in (4, 16, 32, 64, 128, 512):
        runs = [(name, p50(cls, n, rng)) for name, cls in (("general", General), ("array", Residency)) * 2]
        print(f"{n} blocks: " + ", ".join(f"{name} p50 {us:.0f} us" for name, us in runs))


main()
