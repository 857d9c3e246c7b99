"""Where the connector's audit time goes inside a decision: the two records' sub-steps, timed in the decision.

``python benchmarks/results/audit20/write_steps.py [N] [shifted|exact] [hit|miss]`` from a tree's root: bench_connector's
scheduler (8K prompts, ~10K pinned blocks, a real JSONL file), N decisions as sched4's ``decide_steps.py`` makes them,
with the scheduler's ``_lookup`` and its writer's ``write`` replaced by copies of the tree's code with a checkpoint
after each step. Prints the median / p90 / p99 µs per sub-step over the decisions after the first 200, and whether the
slow ``os.write`` calls are the ones that cross into a new page of the file.
"""

from __future__ import annotations

import collections
import os
import random
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, "benchmarks")
import argparse

import bench_connector as bc

from semblend_dynamo.audit import AuditEvent, AuditRecord
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

ns = time.perf_counter_ns
steps: dict[str, int] = {}
writes: list[tuple[int, int, int]] = []  # (file offset before, bytes, ns) per os.write


def instrumented_write(self, record=None, /, *, flush=True, **fields):  # type: ignore[no-untyped-def]
    tag = "v." if flush else "l."
    t0 = ns()
    rec = record if record is not None else AuditRecord(**fields)
    s = to_json_raw = rec.to_json()
    t1 = ns()
    line = s + "\n"
    t2 = ns()
    self._lock.acquire()
    t3 = ns()
    try:
        if self._fd is not None:
            self._pending.append(line)
            t4 = ns()
            if flush:
                data = "".join(self._pending).encode()
                self._pending.clear()
                t5 = ns()
                off = os.lseek(self._fd, 0, os.SEEK_END)
                t6 = ns()
                sent = os.write(self._fd, data)
                t7 = ns()
                assert sent == len(data)
                writes.append((off, len(data), t7 - t6))
                steps["v.join+encode"] = t5 - t4
                steps["v.os.write"] = t7 - t6
                t4 = ns()
        self.by_event[rec.event] += 1
        if rec.rejection_reason is not None:
            self.by_reason[rec.rejection_reason] += 1
        t8 = ns()
    finally:
        self._lock.release()
    t9 = ns()
    del to_json_raw
    steps[tag + "to_json"] = t1 - t0
    steps[tag + "+newline"] = t2 - t1
    steps[tag + "lock acquire"] = t3 - t2
    steps[tag + "append(+send)"] = (t4 - t3) if not flush else 0
    steps[tag + "counters"] = t8 - t4
    steps[tag + "lock release"] = t9 - t8
    return rec


def instrumented_lookup(self, request_id, role, trace_id, *, found, namespace, donor_id, similarity):  # type: ignore[no-untyped-def]
    t0 = ns()
    record = AuditRecord(
        event=AuditEvent.LOOKUP,
        role=role,
        trace_id=trace_id,
        request_id=str(request_id),
        similarity=similarity,
        worker_id=self._worker_id,
        namespace=namespace,
        found=found,
        donor_id=donor_id,
        mode=self.cfg.mode,
    )
    t1 = ns()
    self.audit.write(record, flush=False)
    t2 = ns()
    steps["l.AuditRecord(...)"] = t1 - t0
    steps["l.write (whole)"] = t2 - t1


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    mode = sys.argv[2] if len(sys.argv) > 2 else "shifted"
    case = sys.argv[3] if len(sys.argv) > 3 else "hit"
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    sched.audit.write = types.MethodType(instrumented_write, sched.audit)
    sched._lookup = types.MethodType(instrumented_lookup, sched)
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    prompts = [prompt() for _ in range(n)]
    per: list[dict[str, int]] = []
    whole: list[int] = []
    block = 20_000
    for i, tokens in enumerate(prompts):
        request = HarnessRequest(10_000_000 + i, tokens)
        steps.clear()
        t0 = ns()
        sched.get_num_new_matched_tokens(request, 0)
        t1 = ns()
        if i >= 200:
            per.append(dict(steps))
            whole.append(t1 - t0)
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    cols: dict[str, list[int]] = collections.defaultdict(list)
    for d in per:
        for k, v in d.items():
            cols[k].append(v)

    def q(v: list[int], p: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(len(v) * p))] / 1e3

    print(f"{'sub-step':24s} {'p50':>7s} {'p90':>7s} {'p99':>7s}  (µs, {len(per)} decisions, {mode} {case})")
    for k in cols:
        print(f"{k:24s} {q(cols[k], 0.5):7.2f} {q(cols[k], 0.9):7.2f} {q(cols[k], 0.99):7.2f}")
    print(f"{'whole decision':24s} {q(whole, 0.5):7.2f} {q(whole, 0.9):7.2f} {q(whole, 0.99):7.2f}")
    w = writes[200:]
    cross = [t for off, size, t in w if off // 4096 != (off + size - 1) // 4096]
    inside = [t for off, size, t in w if off // 4096 == (off + size - 1) // 4096]
    sizes = sorted(size for _, size, _ in w)
    print(f"os.write bytes per decision: median {sizes[len(sizes) // 2]}")
    for name, v in (("crosses a page", cross), ("within a page", inside)):
        print(f"os.write {name:15s}: n={len(v):5d} p50 {q(v, 0.5):6.2f} p90 {q(v, 0.9):6.2f} p99 {q(v, 0.99):6.2f}")


if __name__ == "__main__":
    main()
