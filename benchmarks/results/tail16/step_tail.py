"""Which sub-step grows in the slowest decisions, and whether the same prompts are slow again (tail16).

``python benchmarks/results/tail16/step_tail.py N shifted|exact CASE [PASSES]`` from a tree's root, CASE one of
miss / hit / shifted-hit: N prompts of the case (bench_connector's recipe), each decided through the real scheduler
calls, the whole list PASSES times (default 2) in the same order. sub_steps.py's callables are wrapped with
``perf_counter_ns``; per decision the whole decision's thread CPU time and each sub-step's wall time are kept. Prints,
after 200 warm-up decisions of the first pass: the slowest 2% (by CPU time) against the median decision, sub-step by
sub-step; and the rank correlation of each prompt's CPU time between passes (near 0: the tail is not the prompt's
own work; near 1: some prompts cost more).
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from trtllm_connector import connector as cm
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest


def ranks(v: list[float]) -> list[float]:
    order = sorted(range(len(v)), key=v.__getitem__)
    out = [0.0] * len(v)
    for r, i in enumerate(order):
        out[i] = float(r)
    return out


def main() -> None:
    n, mode, case = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    passes = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    cur: dict[str, int] = collections.defaultdict(int)

    def wrap(obj: Any, name: str) -> None:
        f = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter_ns()
            out = f(*a, **k)
            cur[name] += time.perf_counter_ns() - t
            return out

        setattr(obj, name, timed)

    for name in ("read_prompt", "u32_prompt", "request_key", "validate_load", "AuditRecord", "read_tenancy"):
        wrap(cm, name)
    for name in ("_check_backend", "_find_spans", "_lookup"):
        wrap(sched, name)
    wrap(sched.planner, "plan")
    wrap(sched.registry, "longest_prefix")
    wrap(sched.aligner, "align")
    wrap(sched.audit, "write")
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    prompts = [prompt() for _ in range(n)]
    block = 20_000
    cpu: list[list[float]] = []
    steps: list[list[dict[str, int]]] = []
    rid = 10_000_000
    for _ in range(passes):
        cpu.append([])
        steps.append([])
        for tokens in prompts:
            request = HarnessRequest(rid, tokens)
            rid += 1
            cur.clear()
            c = time.thread_time_ns()
            t = time.perf_counter_ns()
            sched.get_num_new_matched_tokens(request, 0)
            cur["(whole, wall)"] = time.perf_counter_ns() - t
            cpu[-1].append((time.thread_time_ns() - c) / 1e3)
            steps[-1].append(dict(cur))
            sched.update_state_after_alloc(request, list(range(block, block + 256)))
            block += 256
            sched.build_connector_meta(SchedulerOutput())
            sched.request_finished(request, [])

    first = cpu[0][200:]
    order = sorted(range(len(first)), key=first.__getitem__)
    k = max(1, len(first) // 50)
    slow = [200 + i for i in order[-k:]]
    mid = [200 + i for i in order[len(order) // 4 : 3 * len(order) // 4]]
    s = sorted(first)
    print(
        f"{case} ({mode}), {n} prompts x {passes} passes; pass 1 CPU p50 {s[len(s) // 2]:.1f} p99 "
        f"{s[int(0.99 * len(s))]:.1f} µs"
    )
    names = sorted({k for d in steps[0] for k in d})
    print("| sub-step | middle half, mean (µs) | slowest 2%, mean (µs) | difference |")
    print("|---|---|---|---|")
    for name in ["(whole, CPU)", *names]:

        def val(i: int, name: str = name) -> float:
            return cpu[0][i] if name == "(whole, CPU)" else steps[0][i].get(name, 0) / 1e3

        a, b = statistics.fmean(val(i) for i in mid), statistics.fmean(val(i) for i in slow)
        print(f"| {name} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    for p in range(1, passes):
        r1, r2 = ranks(cpu[0][200:]), ranks(cpu[p][200:])
        print(
            f"rank correlation of a prompt's CPU time, pass 1 vs pass {p + 1}: "
            f"{statistics.correlation(r1, r2):.2f}; the slowest 2% of pass 1 in pass {p + 1}: mean rank "
            f"{statistics.fmean(r2[i - 200] for i in slow) / len(r2):.0%}"
        )


if __name__ == "__main__":
    main()
