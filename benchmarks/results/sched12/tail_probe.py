"""What the slowest decisions do differently: bench_connector's flow (same prompts, same order, same settle), with
per-decision thread CPU, minor page faults, collections, and the instrumented ``_decide``'s per-statement times.

``python benchmarks/results/sched12/tail_probe.py [N] [shifted|exact]`` from a tree's root. Prints, per case, p50 /
p99 of wall and CPU, then for the decisions at or above the CPU p99: their positions, page faults against the
median decision's, and the statements that made them slow (mean excess over each statement's median).
"""

from __future__ import annotations

import argparse
import collections
import gc
import random
import resource
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/results/sched4")
import bench_connector as bc
import decide_steps as ds

from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    mode = sys.argv[2] if len(sys.argv) > 2 else "shifted"
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    rng = random.Random(1)
    tmp = tempfile.mkdtemp()
    sched, donors = bc.build_scheduler(args, Path(tmp) / "audit.jsonl")
    times: dict[int, int] = {}
    state = {"t": 0}
    decide, lines = ds.instrumented(times, state)
    sched._decide = types.MethodType(decide, sched)  # type: ignore[method-assign]
    cut = 8192 * 3 // 4

    def fresh(k: int) -> list[int]:
        return [rng.randrange(1, 32000) for _ in range(k)]

    misses = [fresh(8192) for _ in range(n)]
    hits = [rng.choice(donors)[:cut] + fresh(8192 - cut) for _ in range(n)]
    shift = bc.TPB + bc.TPB // 4
    shifted = [rng.choice(donors)[shift : shift + cut] + fresh(8192 - cut) for _ in hits]
    target_block = 20_000
    gcs: list[int] = []
    gc.callbacks.append(lambda phase, info: gcs.append(info["generation"]) if phase == "start" else None)
    gc.collect()
    cases = {"miss": misses, "hit": hits}
    if mode == "shifted":
        cases["shifted hit"] = shifted
    for name, prompts in cases.items():
        rows = []
        for i, tokens in enumerate(prompts):
            request = HarnessRequest(10_000_000 + i, tokens)
            times.clear()
            gcs.clear()
            ru0 = resource.getrusage(resource.RUSAGE_THREAD)
            c0 = time.thread_time_ns()
            t0 = state["t"] = time.perf_counter_ns()
            sched.get_num_new_matched_tokens(request, 0)
            t1 = time.perf_counter_ns()
            c1 = time.thread_time_ns()
            ru1 = resource.getrusage(resource.RUSAGE_THREAD)
            rows.append(
                (
                    i,
                    (t1 - t0) / 1e3,
                    (c1 - c0) / 1e3,
                    ru1.ru_minflt - ru0.ru_minflt,
                    ru1.ru_nivcsw - ru0.ru_nivcsw,
                    tuple(gcs),
                    dict(times),
                )
            )
            nb = -(-request.prompt_len // bc.TPB)
            sched.update_state_after_alloc(request, list(range(target_block, target_block + nb)))
            target_block += nb
            sched.build_connector_meta(SchedulerOutput())
            sched.request_finished(request, [])
        report(name, rows, lines)


def report(name: str, rows: list, lines: list[str]) -> None:
    wall = sorted(r[1] for r in rows)
    cpu = sorted(r[2] for r in rows)
    k = int(0.99 * len(rows))
    print(
        f"== {name}: wall p50 {wall[len(wall) // 2]:.1f} p99 {wall[k]:.1f}; CPU p50 {cpu[len(cpu) // 2]:.1f} "
        f"p99 {cpu[k]:.1f}; faults per decision median {sorted(r[3] for r in rows)[len(rows) // 2]}, "
        f"decisions with a collection {sum(1 for r in rows if r[5])}"
    )
    steps: dict[int, list[int]] = collections.defaultdict(list)
    for r in rows:
        for i, ns in r[6].items():
            steps[i].append(ns)
    median = {i: sorted(v)[len(v) // 2] for i, v in steps.items()}
    tail = [r for r in rows if r[2] >= cpu[k] and r[4] == 0]
    print(f"   tail (CPU >= p99, not preempted): {len(tail)} decisions; positions {[r[0] for r in tail]}")
    print(f"   their CPU {[round(r[2]) for r in tail]}")
    print(f"   their faults {[r[3] for r in tail]}; collections {[r[5] for r in tail if r[5]]}")
    if tail:
        excess = {i: sum(r[6].get(i, 0) - median[i] for r in tail) / len(tail) for i in steps}
        for i in sorted(excess, key=lambda i: -excess[i])[:6]:
            where = lines[i].strip()[:80] if i else "entry"
            print(f"   {excess[i] / 1e3:8.1f} (median {median[i] / 1e3:6.1f})  up to line {i}: {where}")


if __name__ == "__main__":
    main()
