"""sa_align alone, on one captured decision's arguments (screen18).

``python benchmarks/results/screen18/align_micro.py hit|miss|shifted-hit [CALLS] [warm|cold]`` from a tree's root:
bench_connector's scheduler (8K prompts, ~10K pinned blocks) runs 50 decisions of the case, the next one's
``sa_align`` arguments are kept (the target copied), then ``sa_align`` is called CALLS times (default 2,000) on them;
``cold`` reads 8 MiB between calls (the caches as a decision's Python leaves them). Prints the median and the 10th
percentile (µs), the filter's size and the rows the screen passed / hit.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo import _native
from trtllm_connector.harness import HarnessRequest


def main() -> None:
    case = sys.argv[1]
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    cold = len(sys.argv) > 3 and sys.argv[3] == "cold"
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=100, mode="shifted", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    call = sched.aligner._call
    assert call is not None and _native.LIBRARY is not None
    kept: list[tuple] = []
    run = call.run

    def capture(table, donors_view, t, max_spans, allowed, **k):  # type: ignore[no-untyped-def]
        kept[:] = [(table, donors_view, t.copy(), max_spans, None if allowed is None else allowed.copy())]
        return run(table, donors_view, t, max_spans, allowed, **k)

    call.run = capture  # type: ignore[method-assign]
    for i in range(51):
        sched.get_num_new_matched_tokens(HarnessRequest(10_000_000 + i, prompt()), 0)
    call.run = run  # type: ignore[method-assign]
    table, donors_view, t, max_spans, allowed = kept[0]
    found = run(table, donors_view, t, max_spans, allowed)  # fills the argument block
    sa_align = _native.LIBRARY.sa_align
    address = call.address
    flush = np.ones(1 << 20, dtype=np.int64)
    times = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        if cold:
            flush += 1
        t0 = clock()
        sa_align(address)
        times.append(clock() - t0)
    times.sort()
    shift = table.filter_shift
    print(f"{times[len(times) // 2] / 1e3:7.2f}  sa_align median ({case}, {'cold' if cold else 'warm'})")
    print(f"{times[len(times) // 10] / 1e3:7.2f}  sa_align p10")
    print(f"filter {((1 << (64 - shift)) >> 3) // 1024} KiB, target {t.size} {t.dtype}, spans {found}")


if __name__ == "__main__":
    main()
