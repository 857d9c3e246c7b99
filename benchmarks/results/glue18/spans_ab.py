"""The aligner's call through the planner module vs through ctypes, alternating per decision in one process (glue18).

``python benchmarks/results/glue18/spans_ab.py N [exact|shifted] [hit|shifted-hit|miss]`` from a tree's root:
bench_connector's scheduler (8K prompts, ~10K pinned blocks, audit to a file) and sched15's settle calls; decision i
runs with ``aligner.spans_in_c = i % 2 == 0`` (the compiled ``spans``) or not (ctypes and ``_spans_of``), so both see
the same load on a shared machine. Prints, per side, the p50 and p99 (µs) of the whole decision
(``get_num_new_matched_tokens``) and of ``_find_spans``, over the decisions after the first 200.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo import span_aligner
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

clock = time.perf_counter_ns


def main() -> None:
    n = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "shifted"
    case = sys.argv[3] if len(sys.argv) > 3 else "hit"
    assert span_aligner.NATIVE_SPANS is not None, span_aligner.NATIVE_SPANS_REASON
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    aligner = sched.aligner
    spent = [0]
    find = sched._find_spans

    def timed(*a: Any) -> Any:
        t = clock()
        out = find(*a)
        spent[0] += clock() - t
        return out

    sched._find_spans = timed
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    sides: dict[bool, tuple[list[int], list[int]]] = {True: ([], []), False: ([], [])}
    block = 20_000
    for i in range(n):
        request = HarnessRequest(10_000_000 + i, prompt())
        in_c = aligner.spans_in_c = i % 2 == 0
        spent[0] = 0
        t = clock()
        sched.get_num_new_matched_tokens(request, 0)
        total = clock() - t
        if i >= 200:
            sides[in_c][0].append(total)
            sides[in_c][1].append(spent[0])
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])

    def q(v: list[int], f: float) -> float:
        return sorted(v)[min(len(v) - 1, int(len(v) * f))] / 1e3

    print(f"python {sys.version.split()[0]}, {mode} {case}, {n} decisions, p50 / p99 (µs)")
    for in_c, label in ((True, "planner-module spans"), (False, "ctypes + _spans_of  ")):
        total, spans = sides[in_c]
        decision = f"decision {q(total, 0.5):7.1f} / {q(total, 0.99):7.1f}"
        print(f"{label}  {decision}   _find_spans {q(spans, 0.5):6.1f} / {q(spans, 0.99):6.1f}")


if __name__ == "__main__":
    main()
