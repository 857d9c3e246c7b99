"""The exact-wins gate's read, ``DonorCatalog.stored_together`` of a prompt's two block hashes, timed in the tree
given (session 19, branch gate19).

A catalog (no discovery) whose residency holds RANKS worker ranks (4 workers of 2 data-parallel ranks for 8) of BLOCKS
stored blocks each, applied as kv-events of 512 blocks, then 300 single-block events a rank (so each map has a base, an
overlay and recent changes in its dict, as under a live event stream). Three probes of two hashes, as the gate asks:

* ``miss``: neither hash stored anywhere (each rank reads one hash);
* ``first``: the first hash stored on every rank, the second nowhere (the span path's usual case: a shared first
  block, the block that would make exact reuse win not stored; each rank reads both);
* ``last-rank``: both stored on the last rank only (True, after every rank is read).

Each is timed per call (``perf_counter``, µs) warm (CALLS calls in a row) and cold (CALLS / 10 calls, 64 MB written
through the caches before each, as between requests through the Frontend), locked (``stored_together``, the lock free,
the router's usual) and lock-free (``Residency.read_stored_together``, the read while the donor thread holds the
lock). Prints p50 / p90 per case.

Usage: ``python benchmarks/results/gate19/gate_ab.py TREE [RANKS] [BLOCKS] [CALLS]``; run it on two trees in turns
(``gate_ab.sh``).
"""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import gc
import sys
import time

TREE = sys.argv[1]
sys.path.insert(0, TREE)

import numpy as np

from semblend_dynamo.events.schemas import KvEvent, KvStored
from semblend_dynamo.router import u64map
from semblend_dynamo.router.catalog import DonorCatalog

RANKS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
BLOCKS = int(sys.argv[3]) if len(sys.argv) > 3 else 50_000
CALLS = int(sys.argv[4]) if len(sys.argv) > 4 else 3000


def main() -> None:
    rng = np.random.default_rng(19)
    catalog = DonorCatalog(capacity=100_000, discovery=None)
    ranks = [(100 + r // 2, r % 2) for r in range(RANKS)]
    shared = int(rng.integers(1, 1 << 63))  # the first block, stored on every rank
    held: list[np.ndarray] = []
    for worker, dp in ranks:
        hashes = rng.integers(1, 1 << 63, BLOCKS, dtype=np.uint64)
        hashes[0] = shared
        held.append(hashes)
        events, event_id = [], 0
        for start in range(0, BLOCKS, 512):
            event_id += 1
            chunk = hashes[start : start + 512].tolist()
            engine = list(range(start, start + len(chunk)))
            events.append(KvEvent(worker, event_id, KvStored(block_hashes=engine, tokens_hashes=chunk), dp_rank=dp))
        for i in range(300):  # single blocks: recent changes in the map's dict and overlay
            event_id += 1
            single = KvStored(block_hashes=[BLOCKS + i], tokens_hashes=[int(rng.integers(1, 1 << 63))])
            events.append(KvEvent(worker, event_id, single, dp_rank=dp))
        catalog.apply_kv_events(events)
    absent = [int(h) for h in rng.integers(1 << 63, (1 << 64) - 1, 2, dtype=np.uint64)]
    probes = {
        "miss": absent,
        "first": [shared, absent[1]],
        "last-rank": [int(held[-1][7]), int(held[-1][BLOCKS // 2])],
    }
    residency = catalog._residency
    assert [catalog.stored_together(p) for p in probes.values()] == [False, False, True]
    assert [residency.read_stored_together(p) for p in probes.values()] == [False, False, True]
    maps = [blocks.hashes for blocks in residency._workers.values()]
    levels = [(len(m._keys), len(m._over_keys), len(m._delta)) for m in maps[:1]]
    gate = getattr(u64map, "NATIVE_GATE_REASON", "python (no compiled gate in this tree)")
    print(f"{TREE}: {RANKS} ranks x {BLOCKS} blocks (rank 0's base/overlay/dict {levels[0]}); gate: {gate}")
    junk = np.ones(64 << 20, dtype=np.uint8)
    gc.disable()
    for temp, calls in (("warm", CALLS), ("cold", CALLS // 10)):
        for name, probe in probes.items():
            for label, read in (("locked", catalog.stored_together), ("lock-free", residency.read_stored_together)):
                times = []
                for _ in range(calls):
                    if temp == "cold":
                        junk += 1
                    t0 = time.perf_counter()
                    read(probe)
                    times.append((time.perf_counter() - t0) * 1e6)
                p50, p90 = np.percentile(times, 50), np.percentile(times, 90)
                print(f"  {temp} {name:9s} {label:9s} p50 {p50:6.2f} p90 {p90:6.2f} µs")
    gc.enable()


main()
