"""The block map's (``U64Map``) longest single change in thread CPU time (robust to a busy VM's preemption, unlike
wall time), and which internal steps ran in the slowest ones: 100,000 new keys inserted into a map of 1.6M entries
(one worker rank's blocks at 100K donors of 16 blocks), in kv-event sized calls of 256 and one at a time.

Usage: PYTHONPATH=TREE python benchmarks/results/lock7/u64map_step_cpu.py (TREE: the code to measure)
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from semblend_dynamo.router import u64map
from semblend_dynamo.router.u64map import U64Map

RECORDED: list[tuple[str, float]] = []


def record(name: str) -> None:
    method = getattr(U64Map, name)

    def recorded(self: U64Map, *args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return method(self, *args, **kwargs)
        finally:
            RECORDED.append((name, (time.thread_time() - t0) * 1e3))

    setattr(U64Map, name, recorded)


def main() -> None:
    for name in ("_rewrite_step", "_merge_overlay", "_build_dir", "_merge_delta"):
        record(name)
    rng = np.random.default_rng(1)
    entries, changes = 1_600_000, 100_000
    keys = rng.choice(1 << 62, size=entries + changes, replace=False).astype(np.uint64)
    m = U64Map()
    m.assign(np.sort(keys[:entries]), np.sort(keys[:entries]))
    m.arrays()
    print(f"# {u64map.__file__}")
    new = keys[entries:].tolist()
    for batch in (256, 1):
        cpu, worst = [], []
        for at in range(0, changes if batch > 1 else changes // 2, batch):
            part = new[at : at + batch]
            seen = len(RECORDED)
            t0 = time.thread_time()
            if batch == 1:
                m[part[0]] = part[0]
            else:
                m.set_many(part, part)
            cpu.append((time.thread_time() - t0) * 1e3)
            worst.append((cpu[-1], RECORDED[seen:]))
        c = np.array(cpu)
        print(
            f"{batch} a call: thread CPU ms p50 {np.percentile(c, 50):.3f}, p99.9 {np.percentile(c, 99.9):.2f}, "
            f"max {c.max():.2f}, mean {c.mean():.3f}"
        )
        for spent, inside in sorted(worst, key=lambda w: -w[0])[:3]:
            print(f"   {spent:.2f} ms: " + ", ".join(f"{name} {t:.2f}" for name, t in inside))
        new = new[::-1]  # the same keys again: changes of held keys


if __name__ == "__main__":
    main()
