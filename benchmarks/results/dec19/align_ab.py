"""This tree's compiled span search against a base tree's, in one process, alternating per decision (dec19).

``python benchmarks/results/dec19/align_ab.py BASE_TREE [N] [hit|shifted-hit|miss]`` from this tree's root (its
packages on the path, its modules built; the base tree's ``libspan_aligner.so`` built, from a ``span_aligner.c`` with
the same structures): bench_connector's scheduler (8K prompts, ~10K pinned blocks, shifted mode, audit to a file) and
its per-request settle calls, as ``sched4/decide_steps.py``; decision i calls this tree's ``sa_align`` when i is even,
the base's when odd (the planner module calls it by address: ``_native.SA_ALIGN_ADDRESS`` swapped). Prints per
variant the decision's and ``_find_spans``' p50 / p90 / p99 (µs) over the decisions after the first 200, and checks
that both variants promised the same tokens.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo import _native
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest


def main() -> None:
    base = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    case = sys.argv[3] if len(sys.argv) > 3 else "hit"
    assert _native.LIBRARY is not None and _native.SA_ALIGN_ADDRESS, _native.REASON
    other = ctypes.CDLL(str(base / "semblend_dynamo" / "_native" / "libspan_aligner.so"))
    addresses = {"this": _native.SA_ALIGN_ADDRESS, "base": ctypes.cast(other.sa_align, ctypes.c_void_p).value}
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    clock = time.perf_counter_ns
    spent = [0]
    find_spans = sched._find_spans

    def timed(*a):  # type: ignore[no-untyped-def]
        t0 = clock()
        out = find_spans(*a)
        spent[0] = clock() - t0
        return out

    sched._find_spans = timed  # type: ignore[method-assign]
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    prompts = [prompt() for _ in range(n)]
    results: dict[str, list[tuple[float, float, int]]] = {"this": [], "base": []}
    block = 20_000
    for i, tokens in enumerate(prompts):
        label = "this" if i % 2 == 0 else "base"
        _native.SA_ALIGN_ADDRESS = addresses[label]
        request = HarnessRequest(10_000_000 + i, tokens)
        t0 = clock()
        promised, _ = sched.get_num_new_matched_tokens(request, 0)
        t1 = clock()
        if i >= 200:
            results[label].append(((t1 - t0) / 1e3, spent[0] / 1e3, promised))
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    print(f"case {case}, {n} decisions alternating (first 200 not counted)")
    for label, rows in results.items():
        parts = []
        for k, name in ((0, "decision"), (1, "_find_spans")):
            v = sorted(r[k] for r in rows)
            parts.append(f"{name} {v[len(v) // 2]:.1f} / {v[int(len(v) * 0.9)]:.1f} / {v[int(len(v) * 0.99)]:.1f}")
        print(f"{label}: " + "; ".join(parts) + f"; promised {sum(r[2] for r in rows)} tokens")


if __name__ == "__main__":
    main()
