"""The placement's donor lookup (``DonorCatalog.resident_donor``, on the event loop) while the donor thread adds
8K-token registrations, as in the Frontend graph: how long each lookup takes, of the code at ``--code``.

A catalog with ``--donors`` resident donors of 16 blocks on 2 workers (no pipeline); a writer thread adds 8K-token
registrations (256 blocks, half of them blocks of seeded donors, as the benchmark's span prompts are) back to back
with a pause of ``--pause-ms``, each on its own worker in turn; the main thread looks up a random seeded donor every
0.5 ms for ``--seconds`` and times each lookup.

Usage: python benchmarks/results/tail6/resident_read.py --code TREE [--donors 100000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--code", required=True)
    p.add_argument("--donors", type=int, default=100_000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--pause-ms", type=float, default=2.0)
    args = p.parse_args()
    sys.path.insert(0, str(Path(args.code).resolve()))
    sys.setswitchinterval(0.0005)
    from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored
    from semblend_dynamo.router.catalog import DonorCatalog

    workers = (11, 12)
    rng = np.random.default_rng(3)
    catalog = DonorCatalog(2 * args.donors + 10_000, None)
    hashes = rng.integers(1, 1 << 62, size=(args.donors, 16), dtype=np.int64)

    def registration(i: str, worker: int, blocks: list[int]) -> DonorRegistration:
        return DonorRegistration(
            donor_id=i,
            worker_id=worker,
            deployment="d",
            namespace="ns",
            num_tokens=32 * len(blocks),
            block_size=32,
            block_hashes=blocks,
            embedding=b"",
            embedding_dim=0,
        )

    t0 = time.perf_counter()
    chunk = 1024
    for start in range(0, args.donors, chunk):
        rows = range(start, min(start + chunk, args.donors))
        for worker in workers:
            mine = [i for i in rows if i % 2 == workers.index(worker)]
            blocks = hashes[mine].ravel().tolist()
            ids = [(1 << 40) + i * 16 + j for i in mine for j in range(16)]
            catalog.apply_kv_events([KvEvent(worker, start // chunk + 1, KvStored(ids, blocks))])
            catalog.add_many(registration(f"seed-{i}", worker, hashes[i].tolist()) for i in mine)
    seeded = time.perf_counter() - t0
    assert catalog.resident_donor("seed-0") is not None

    stop = threading.Event()
    added = [0]

    def writer() -> None:
        n = 0
        while not stop.is_set():
            worker = workers[n % 2]
            shared = hashes[rng.choice(args.donors, 8, replace=False)].ravel().tolist()
            blocks = rng.integers(1, 1 << 62, 128).tolist() + shared
            catalog.add(registration(f"served-{n}", worker, blocks))
            n += 1
            added[0] = n
            time.sleep(args.pause_ms / 1000)

    thread = threading.Thread(target=writer, name="semblend-donors")
    thread.start()
    reads = []
    end = time.perf_counter() + args.seconds
    picks = rng.integers(0, args.donors, 1 << 20)
    k = 0
    while time.perf_counter() < end:
        donor = f"seed-{picks[k % len(picks)]}"
        k += 1
        t = time.perf_counter()
        assert catalog.resident_donor(donor) is not None
        reads.append(time.perf_counter() - t)
        time.sleep(0.0005)
    stop.set()
    thread.join()
    ms = np.array(reads) * 1e3
    print(
        json.dumps(
            {
                "code": args.code,
                "seed_s": round(seeded, 1),
                "adds": added[0],
                "reads": len(ms),
                "p50_ms": round(float(np.percentile(ms, 50)), 4),
                "p99_ms": round(float(np.percentile(ms, 99)), 4),
                "max_ms": round(float(ms.max()), 2),
                "over_1ms": int((ms > 1).sum()),
                "over_5ms": int((ms > 5).sum()),
            }
        )
    )


if __name__ == "__main__":
    main()
