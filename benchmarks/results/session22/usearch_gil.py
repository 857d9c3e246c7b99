"""Does a busy Python thread slow usearch's multi-threaded add? The product's i8 settings (``DonorIndex``, usearch),
10K random unit 384-d vectors into an index that already holds 10K, once alone and once while another thread runs
Python (a counting loop, as an event loop adding a sync's donors would), three rounds each. Wall time of the add, and
how far the other thread got (it runs only while the add has let the GIL go). An argument sets the interpreter's
switch interval in seconds (Python's default: 0.005).

    python benchmarks/results/session22/usearch_gil.py [SWITCH_INTERVAL_S]
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from semblend_dynamo.donor_index import DonorIndex, IndexBackend

if len(sys.argv) > 1:
    sys.setswitchinterval(float(sys.argv[1]))
print(f"# switch interval {sys.getswitchinterval() * 1e3:.1f} ms", flush=True)
rng = np.random.default_rng(3)
vectors = rng.standard_normal((20_000, 384)).astype(np.float32)
vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
ids = [f"d{i}" for i in range(len(vectors))]


def busy(stop: threading.Event, counted: list[int]) -> None:
    n = 0
    while not stop.is_set():
        n += 1
    counted.append(n)


for rnd in range(3):
    for other in ("alone", "beside a busy thread"):
        index = DonorIndex(384, 30_000, IndexBackend.USEARCH)
        index.insert_batch(ids[:10_000], "ns", vectors[:10_000])
        stop, counted = threading.Event(), []
        thread = threading.Thread(target=busy, args=(stop, counted)) if other != "alone" else None
        if thread is not None:
            thread.start()
        started = time.perf_counter()
        index.insert_batch(ids[10_000:], "ns", vectors[10_000:])
        wall = time.perf_counter() - started
        stop.set()
        if thread is not None:
            thread.join()
        spins = f", the other thread counted {counted[0] / wall / 1e6:.1f}M a second" if counted else ""
        print(f"round {rnd}, {other}: 10K adds in {wall:.2f} s{spins}", flush=True)
