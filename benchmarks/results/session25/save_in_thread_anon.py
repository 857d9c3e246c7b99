"""Session 25: RSS of anonymous mappings and of the main heap around a usearch DonorIndex's snapshot save run in a
thread (as the serving replica's SnapshotServer runs it, with asyncio.to_thread), each read after malloc_trim(0).

    python benchmarks/results/session25/save_in_thread_anon.py 100000
    MALLOC_ARENA_MAX=1 python benchmarks/results/session25/save_in_thread_anon.py 100000
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from semblend_dynamo.config import IndexBackend
from semblend_dynamo.donor_index import DonorIndex
from semblend_dynamo.index_snapshot import file_digest

CHUNK = 10_000


def rss_by_kind() -> dict[str, int]:
    """MiB resident in anonymous mappings and in the main heap (after a trim)."""
    ctypes.CDLL(None).malloc_trim(0)
    kinds: dict[str, int] = {}
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:
            name = parts[5] if len(parts) > 5 else "[anon]"
        elif parts[0] == "Rss:":
            kinds[name] = kinds.get(name, 0) + int(parts[1])
    return {kind: round(kinds.get(kind, 0) / 1024) for kind in ("[anon]", "[heap]")}


def save(index: DonorIndex) -> None:
    path = tempfile.mktemp(suffix=".snapshot")
    index.save_snapshot(path)
    file_digest(path)
    os.unlink(path)


def main(n: int) -> None:
    index = DonorIndex(384, n + 10, IndexBackend.USEARCH, dtype="i8")
    rng = np.random.default_rng(0)
    for start in range(0, n, CHUNK):
        ids = [f"w1-donor-{i:08d}" for i in range(start, start + CHUNK)]
        index.insert_batch(ids, "a" * 16, rng.standard_normal((CHUNK, 384)).astype(np.float32))
    print("built", rss_by_kind(), flush=True)
    for k in range(3):
        worker = threading.Thread(target=save, args=(index,))
        worker.start()
        worker.join()
        print("saved in a thread", k, rss_by_kind(), flush=True)
    save(index)
    print("saved on the main thread", rss_by_kind(), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
