"""Median µs of the calls a decision makes, timed in the decision flow (each call wrapped, ~0.2 µs added each).

``python benchmarks/results/sched7/call_times.py [N] [exact|shifted] [hit|shifted-hit|miss]`` from a tree's root:
builds bench_connector's scheduler (8K prompts, ~10K pinned blocks), wraps the scheduler's and the connector module's
per-decision callees with a timer, runs N decisions of the case with bench_connector's per-request calls and prints
each callee's median and p90 over the decisions after the first 200 (a callee called twice in one decision counts
its sum).
"""

from __future__ import annotations

import argparse
import collections
import functools
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

MODULE_FUNCS = (
    "read_prompt",
    "u32_tokens",
    "u32_prompt",
    "request_key",
    "read_tenancy",
    "new_trace_id",
    "validate_load",
    "read_lora",
)
METHODS = ("_find_spans", "_approximate_donors", "_lookup", "_check_backend", "_namespace_digest", "_hint_candidates")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    mode = sys.argv[2] if len(sys.argv) > 2 else "shifted"
    case = sys.argv[3] if len(sys.argv) > 3 else "shifted-hit"
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    acc: dict[str, int] = collections.defaultdict(int)

    def timed(name: str, f: Any) -> Any:
        @functools.wraps(f)
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return f(*a, **k)
            finally:
                acc[name] += time.perf_counter_ns() - t

        return wrapper

    for name in MODULE_FUNCS:
        if hasattr(cm, name):
            setattr(cm, name, timed(name, getattr(cm, name)))
    for name in METHODS:
        if hasattr(sched, name):
            setattr(sched, name, timed(name, getattr(sched, name)))
    sched.planner.plan = timed("planner.plan", sched.planner.plan)  # type: ignore[method-assign]
    sched.hints.take = timed("hints.take", sched.hints.take)  # type: ignore[method-assign]
    sched.registry.lease = timed("registry.lease", sched.registry.lease)  # type: ignore[method-assign]
    sched.audit.write = timed("audit.write", sched.audit.write)  # type: ignore[method-assign]
    record_class = cm.AuditRecord
    record_class.to_json = timed("AuditRecord.to_json", record_class.to_json)  # type: ignore[method-assign]
    cm.AuditRecord = timed("AuditRecord()", record_class)  # type: ignore[misc]
    sched.audit._send = timed("AuditWriter._send", sched.audit._send)  # type: ignore[method-assign]
    hist = cm.metrics.DECISION_LATENCY
    hist.observe = timed("DECISION_LATENCY.observe", hist.observe)  # type: ignore[method-assign]
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)
    per: dict[str, list[int]] = collections.defaultdict(list)
    totals: list[int] = []
    block = 20_000
    for i in range(n):
        if start is None:
            tokens = [rng.randrange(1, 32000) for _ in range(8192)]
        else:
            tokens = rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]
        request = HarnessRequest(10_000_000 + i, tokens)
        acc.clear()
        t = time.perf_counter_ns()
        sched.get_num_new_matched_tokens(request, 0)
        total = time.perf_counter_ns() - t
        if i >= 200:
            totals.append(total)
            for k, v in acc.items():
                per[k].append(v)
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    totals.sort()
    print(f"{mode} {case}: decision p50 {totals[len(totals) // 2] / 1e3:.1f} µs (wrapped calls included)")
    for k, v in sorted(per.items(), key=lambda kv: -sorted(kv[1])[len(kv[1]) // 2]):
        v.sort()
        print(f"{v[len(v) // 2] / 1e3:8.2f} {v[int(len(v) * 0.9)] / 1e3:8.2f}  {k} ({len(v)} decisions)")


if __name__ == "__main__":
    main()
