"""Sub-step timing in decide_steps' flow (sched15).

``python benchmarks/results/sched15/sub_steps.py N exact|shifted hit|shifted-hit|miss`` from a tree's root: wraps named
callables of the decision with ``perf_counter_ns`` and prints each one's median (µs, summed per decision: a hit makes
two ``AuditRecord`` and two ``audit.write`` calls) after the first 200 decisions.
"""

from __future__ import annotations

import argparse
import collections
import random
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


def main() -> None:
    n, mode, case = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    acc: dict[str, list[int]] = collections.defaultdict(list)
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
    for name in ("_check_backend", "_find_spans", "_lookup", "_approximate_donors"):
        wrap(sched, name)
    wrap(sched.planner, "plan")
    wrap(sched.registry, "longest_prefix")
    wrap(sched.registry, "lease")
    wrap(sched.aligner, "align")
    wrap(sched.audit, "write")
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    block = 20_000
    totals = []
    for i in range(n):
        request = HarnessRequest(10_000_000 + i, prompt())
        cur.clear()
        t = time.perf_counter_ns()
        sched.get_num_new_matched_tokens(request, 0)
        d = time.perf_counter_ns() - t
        if i >= 200:
            totals.append(d)
            for k, v in cur.items():
                acc[k].append(v)
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])

    def median(v: list[int]) -> float:
        return sorted(v)[len(v) // 2] / 1e3

    print(f"total p50 {median(totals):.1f}")
    for k, v in acc.items():
        print(f"{median(v):7.2f}  {k}")


if __name__ == "__main__":
    main()
