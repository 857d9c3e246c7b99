"""Which slow decisions coincide with a garbage collection, and how many GC-tracked objects a request leaves behind.

``python benchmarks/results/sched7/gc_tail.py [N] [exact|shifted] [hit|shifted-hit|miss] [gen0-threshold] [heap]``
from a tree's root: builds bench_connector's scheduler (8K prompts, ~10K pinned blocks), optionally sets the
generation-0 threshold (0: Python's default 700) and keeps ``heap`` extra live tracked objects, then runs N decisions
of the case with bench_connector's per-request calls. Per decision it records the wall time and every collection that
ran inside it (generation, duration from ``gc.callbacks``); it prints the p50/p99, how many of the decisions at or
above the p99 had a collection inside (and their mean collection time), and the net change of ``gc.get_count()[0]``
over a decision and over a whole request (decision + alloc + meta + finish): allocations of tracked objects that
outlive the call, which is what brings the next collection closer.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    mode = sys.argv[2] if len(sys.argv) > 2 else "shifted"
    case = sys.argv[3] if len(sys.argv) > 3 else "shifted-hit"
    threshold = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    heap_n = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    prompts = [prompt() for _ in range(n)]
    heap = [[i] for i in range(heap_n)]
    if threshold:
        gc.set_threshold(threshold)
    gc.collect()
    events: list[tuple[int, int]] = []  # (generation, ns) of the collections in the decision under way
    began = [0]
    active = [False]

    def callback(phase: str, info: dict[str, int]) -> None:
        if not active[0]:
            return
        if phase == "start":
            began[0] = time.perf_counter_ns()
        else:
            events.append((info["generation"], time.perf_counter_ns() - began[0]))

    gc.callbacks.append(callback)
    walls: list[int] = []
    per_decision: list[list[tuple[int, int]]] = []
    d_count: list[int] = []
    r_count: list[int] = []
    block = 20_000
    for i, tokens in enumerate(prompts):
        request = HarnessRequest(10_000_000 + i, tokens)
        events.clear()
        c0 = gc.get_count()[0]
        active[0] = True
        t = time.perf_counter_ns()
        sched.get_num_new_matched_tokens(request, 0)
        wall = time.perf_counter_ns() - t
        c1 = gc.get_count()[0]
        inside = list(events)
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
        del request
        c2 = gc.get_count()[0]
        active[0] = False
        events_after = len(events)
        if i >= 200:
            walls.append(wall)
            per_decision.append(inside)
            if not events_after:  # a collection resets the count: only deltas without one are counted
                d_count.append(c1 - c0)
                r_count.append(c2 - c0)
    gc.callbacks.remove(callback)
    del heap
    order = sorted(range(len(walls)), key=walls.__getitem__)
    p50, p99 = walls[order[len(order) // 2]], walls[order[int(len(order) * 0.99)]]
    tail = [i for i in order if walls[i] >= p99]
    with_gc = [i for i in tail if per_decision[i]]
    all_gc = [i for i in range(len(walls)) if per_decision[i]]
    gc_ns = [sum(ns for _, ns in per_decision[i]) for i in with_gc]
    gens = sorted({g for i in all_gc for g, _ in per_decision[i]})
    print(f"{mode} {case}: gc threshold {gc.get_threshold()}, {heap_n} extra live objects, {len(walls)} decisions")
    print(f"p50 {p50 / 1e3:.1f} µs, p99 {p99 / 1e3:.1f} µs")
    print(f"decisions with a collection inside: {len(all_gc)} (generations {gens})")
    mean = sum(gc_ns) / len(gc_ns) / 1e3 if gc_ns else 0.0
    print(f"of the {len(tail)} at or above the p99: {len(with_gc)} had a collection inside (mean {mean:.1f} µs of it)")
    if d_count:
        print(f"net tracked objects per decision (no collection inside): median {sorted(d_count)[len(d_count) // 2]}")
    if r_count:
        print(
            f"net tracked objects per whole request (no collection in it): median {sorted(r_count)[len(r_count) // 2]}"
        )


if __name__ == "__main__":
    main()
