"""The longest single change to a router's block map (``U64Map``): its base rewrites done in steps, against the
same map rewriting its base all at once (the previous behaviour), measured in the same run.

A router applies Dynamo's kv-events to these maps on its event loop, so the longest change is how long a request
can wait behind one. Usage: ``python benchmarks/bench_u64map_pause.py [--entries 800000] [--changes 200000]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from semblend_dynamo.router import u64map
from semblend_dynamo.router.u64map import U64Map


def run(entries: int, changes: int, batch: int, seed: int) -> dict[str, float]:
    """Per-change (or per-batch) times in ms over ``changes`` inserts into a map of ``entries``."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(1 << 62, size=entries + changes, replace=False).astype(np.uint64)
    m = U64Map()
    m.assign(np.sort(keys[:entries]), np.sort(keys[:entries]))
    m.arrays()
    new = keys[entries:].tolist()
    times = []
    for at in range(0, changes, batch):
        part = new[at : at + batch]
        t0 = time.perf_counter()
        if batch == 1:
            m[part[0]] = part[0]
        else:
            m.set_many(part, part)
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    return {"p50": float(np.percentile(ms, 50)), "p99.9": float(np.percentile(ms, 99.9)), "max": float(ms.max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=800_000, help="entries in the map first (default 800000)")
    parser.add_argument("--changes", type=int, default=200_000, help="keys inserted after (default 200000)")
    args = parser.parse_args()
    if args.entries < 1 or args.changes < 1:
        parser.error("--entries and --changes must be >= 1")
    print(
        f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}"
    )
    print(f"# map of {args.entries:,} entries, {args.changes:,} new keys inserted; ms per call")
    print("| base rewrite | inserts | p50 | p99.9 | max |")
    print("|---|---|---|---|---|")
    # the step bounds of this tree's map (older trees: _STEPS and _MIN_STEP; later ones: _MIN_STEP and _MAX_STEP)
    bounds = {name: getattr(u64map, name) for name in ("_STEPS", "_MIN_STEP", "_MAX_STEP") if hasattr(u64map, name)}
    whole = {name: 1 if name == "_STEPS" else 1 << 62 for name in bounds}
    print(f"# {u64map.__file__}: {bounds}")
    for batch in (1, 256):
        for name in ("all at once (before)", "in steps"):
            for bound, value in (whole if name.startswith("all") else bounds).items():
                setattr(u64map, bound, value)
            r = run(args.entries, args.changes, batch, seed=1)
            label = "one at a time" if batch == 1 else f"{batch} a call"
            print(f"| {name} | {label} | {r['p50']:.3f} | {r['p99.9']:.2f} | {r['max']:.2f} |")


if __name__ == "__main__":
    main()
