"""Where an exact hit's decision goes: time between checkpoints inserted after each statement of ``_decide``.

``python benchmarks/results/sched4/decide_steps.py [N] [exact|shifted] [hit|shifted-hit|miss]`` from a tree's root
(its ``benchmarks/`` and packages on the path): builds bench_connector's scheduler (8K prompts, ~10K pinned blocks, in
the mode given, exact by default), compiles a copy of ``SemBlendConnectorScheduler._decide`` with a checkpoint after
every top-level statement, runs N decisions of the case given (default 2,000 hits)
with bench_connector's per-request calls, and prints the median and p90 µs per checkpoint over the decisions after
the first 200, then the decisions at or above the p99 of the whole and the steps that made them slow (mean excess over
each step's median). The checkpoints add ~0.1 µs each.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import random
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from trtllm_connector import connector as cm
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

SKIP = (")", "]", "}", "else", "except", "elif")


def instrumented(times: dict[int, int], state: dict[str, int]) -> tuple[types.FunctionType, list[str]]:
    lines = textwrap.dedent(inspect.getsource(cm.SemBlendConnectorScheduler._decide)).splitlines()
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        indent = len(nxt) - len(nxt.lstrip()) if nxt.strip() else 0
        stripped = line.strip()
        if i == 0:
            out.append("    _CP(0)")
        elif (
            indent == 4
            and not nxt.strip().startswith(SKIP)
            and not stripped.endswith(("(", ",", "[", "{"))
            and not stripped.startswith("return")
        ):
            out.append(f"    _CP({i})")

    def checkpoint(i: int) -> None:
        now = time.perf_counter_ns()
        times[i] = now - state["t"]
        state["t"] = time.perf_counter_ns()

    namespace = dict(cm.__dict__, _CP=checkpoint)
    exec("\n".join(out), namespace)  # a copy of our own method, instrumented
    return namespace["_decide"], lines


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    mode = sys.argv[2] if len(sys.argv) > 2 else "exact"
    case = sys.argv[3] if len(sys.argv) > 3 else "hit"
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    times: dict[int, int] = {}  # checkpoint -> ns since the previous one, for the decision under way
    decisions: list[dict[int, int]] = []
    state = {"t": 0}
    decide, lines = instrumented(times, state)
    sched._decide = types.MethodType(decide, sched)  # type: ignore[method-assign]
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:  # a miss
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    hits = [prompt() for _ in range(n)]
    block = 20_000
    for i, tokens in enumerate(hits):
        request = HarnessRequest(10_000_000 + i, tokens)
        times.clear()
        state["t"] = time.perf_counter_ns()
        sched.get_num_new_matched_tokens(request, 0)
        if i >= 200:
            decisions.append(dict(times))
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    report(decisions, lines)


def report(decisions: list[dict[int, int]], lines: list[str]) -> None:
    """Median and p90 per checkpoint; then the decisions at or above the p99 of the sum and which steps made them."""
    steps: dict[int, list[int]] = collections.defaultdict(list)
    for d in decisions:
        for i, ns in d.items():
            steps[i].append(ns)
    median = {i: sorted(v)[len(v) // 2] for i, v in steps.items()}
    for i in sorted(steps):
        v = sorted(steps[i])
        where = lines[i].strip()[:90] if i else "entry"
        print(f"{median[i] / 1e3:7.2f} {v[int(len(v) * 0.9)] / 1e3:7.2f}  up to line {i}: {where}")
    totals = sorted(sum(d.values()) for d in decisions)
    p50, p99 = totals[len(totals) // 2], totals[int(len(totals) * 0.99)]
    print(f"sum of medians {sum(median.values()) / 1e3:.1f}; sum per decision p50 {p50 / 1e3:.1f}, p99 {p99 / 1e3:.1f}")
    tail = [d for d in decisions if sum(d.values()) >= p99]
    excess = {i: sum(d.get(i, 0) - median[i] for d in tail) / len(tail) for i in steps}
    print(f"the {len(tail)} decisions at or above the p99: mean excess over each step's median, largest first")
    for i in sorted(excess, key=lambda i: -excess[i])[:6]:
        where = lines[i].strip()[:90] if i else "entry"
        print(f"{excess[i] / 1e3:9.1f}  up to line {i}: {where}")


if __name__ == "__main__":
    main()
