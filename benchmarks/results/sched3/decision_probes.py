"""What a decision allocates, faults and collects, and what one audit write costs: the probes behind sched3's notes.

``python benchmarks/results/sched3/decision_probes.py [N]`` from a tree's root (its ``benchmarks/`` and packages on
the path). bench_connector's scheduler (8K prompts, ~10K pinned blocks, exact mode), N misses then N hits (default
2,000), each followed by bench_connector's untimed calls (requests finished). Per case: GC-tracked objects a decision
leaves alive (``gc.get_count()`` across it, with the collector off), the ``tracemalloc`` peak above the start of the
decision (second half of the case), minor page faults per decision (``getrusage``), and, with the collector on, the
collections starting inside a decision per 1,000 decisions and the longest of them. Last, two audit lines written
and flushed as the connector does, 20,000 times with 50 µs between, to a file in the temp directory and in /dev/shm.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

LINE = (
    '{"event":"promised","ts":1764177600.123456,"run_id":"0123456789abcdef","role":"recipient","trace_id":'
    '"0123456789abcdef","request_id":"10000001","donor_id":"0:4","worker_id":"0","namespace":"' + "ab" * 16 + '",'
    '"num_new_matched_tokens":6112,"tokens":6112,"blocks":191,"delta":0,"requires_rope_correction":false,'
    '"lineage":"exact","mode":"exact","latency_us":123.4}\n'
)


def write_latency(directory: str) -> str:
    with open(Path(directory) / "audit.jsonl", "a", encoding="utf-8") as f:
        xs = []
        for _ in range(20_000):
            t0 = time.perf_counter_ns()
            f.write(LINE)
            f.write(LINE)
            f.flush()
            xs.append(time.perf_counter_ns() - t0)
            t1 = time.perf_counter_ns()
            while time.perf_counter_ns() - t1 < 50_000:
                pass
    xs.sort()
    n = len(xs)
    return f"p50 {xs[n // 2] / 1e3:.1f} µs, p99 {xs[int(n * 0.99)] / 1e3:.1f}, p99.9 {xs[int(n * 0.999)] / 1e3:.1f}"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="exact", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    rng = random.Random(1)
    cut = 8192 * 3 // 4

    def fresh(k: int) -> list[int]:
        return [rng.randrange(1, 32000) for _ in range(k)]

    cases = {
        "miss": [fresh(8192) for _ in range(n)],
        "hit": [rng.choice(donors)[:cut] + fresh(8192 - cut) for _ in range(n)],
    }
    block = 30_000
    request_id = 10_000_000
    active = [False]
    started = [0]
    collections: list[tuple[int, float]] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if not active[0]:
            return
        if phase == "start":
            started[0] = time.thread_time_ns()
        else:
            collections.append((info["generation"], (time.thread_time_ns() - started[0]) / 1e3))

    gc.callbacks.append(on_gc)
    for name, prompts in cases.items():
        alive, peaks, faults = [], [], []
        collections.clear()
        for i, tokens in enumerate(prompts):
            request_id += 1
            request = HarnessRequest(request_id, tokens)
            probe = i % 2 == 0  # even: collector off, objects and memory; odd: collector on, collections
            if probe:
                gc.disable()
                if i >= n // 2:
                    tracemalloc.start()
                count = gc.get_count()[0]
            rusage = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            active[0] = not probe
            sched.get_num_new_matched_tokens(request, 0)
            active[0] = False
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - rusage)
            if probe:
                alive.append(gc.get_count()[0] - count)
                if tracemalloc.is_tracing():
                    peaks.append(tracemalloc.get_traced_memory()[1])
                    tracemalloc.stop()
                gc.enable()
            sched.update_state_after_alloc(request, list(range(block, block + 256)))
            block += 256
            sched.build_connector_meta(SchedulerOutput())
            sched.request_finished(request, [])
        per_1000 = [sum(g == k for g, _ in collections) * 1000 / (n // 2) for k in (0, 1, 2)]
        longest = max((d for _, d in collections), default=0.0)
        print(
            f"{name}: GC-tracked objects left alive per decision median {statistics.median(alive):.0f} "
            f"(max {max(alive)}); tracemalloc peak median {statistics.median(peaks) / 1024:.0f} KiB; minor faults per "
            f"decision mean {statistics.mean(faults):.2f} (max {max(faults)}); collections inside a decision per 1,000 "
            f"(gen 0/1/2) {'/'.join(f'{x:.1f}' for x in per_1000)}, longest {longest:.0f} µs CPU"
        )
    print(f"audit: two lines + flush, temp-directory file: {write_latency(tempfile.mkdtemp())}")
    if os.path.isdir("/dev/shm"):
        print(f"audit: two lines + flush, /dev/shm file: {write_latency(tempfile.mkdtemp(dir='/dev/shm'))}")


if __name__ == "__main__":
    main()
