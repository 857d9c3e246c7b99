"""Where a shifted-mode decision's span search goes: the whole ``SpanAligner.align`` call and the compiled ``sa_align``
call inside it, per decision, in bench_connector's flow.

``python benchmarks/results/sched10/align_parts.py [N] [miss|hit|shifted-hit] [LABEL]`` from a tree's root (its
``benchmarks/`` and packages on the path): builds bench_connector's scheduler in shifted mode (8K prompts, ~10K pinned
blocks), runs N decisions of the case with bench_connector's per-request calls, and prints the medians and p90s (µs,
after the first 200) of ``align`` and of ``sa_align`` (the ctypes call, the GIL's release included), and of their
difference: the Python around the compiled search. Works with any tree whose aligner calls ``LIBRARY.sa_align``.
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

from semblend_dynamo import _native
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest


class _TimedLibrary:
    """The loaded library, its ``sa_align`` timed (the other names passed through)."""

    def __init__(self, lib: Any, sink: list[int]) -> None:
        self._lib = lib
        self._sink = sink
        call = lib.sa_align

        def sa_align(*args: Any) -> Any:
            start = time.perf_counter_ns()
            out = call(*args)
            sink.append(time.perf_counter_ns() - start)
            return out

        self.sa_align = sa_align

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    case = sys.argv[2] if len(sys.argv) > 2 else "miss"
    label = sys.argv[3] if len(sys.argv) > 3 else ""
    if _native.LIBRARY is None:
        print(f"{label} {case}: no native aligner ({_native.REASON})")
        return
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    c_calls: list[int] = []
    _native.LIBRARY = _TimedLibrary(_native.LIBRARY, c_calls)  # type: ignore[assignment]
    aligner = sched.aligner
    align = aligner.align
    whole: list[int] = []

    def timed_align(*a: Any, **k: Any) -> Any:
        start = time.perf_counter_ns()
        out = align(*a, **k)
        whole.append(time.perf_counter_ns() - start)
        return out

    aligner.align = timed_align  # type: ignore[method-assign]
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    prompts = [prompt() for _ in range(n)]
    block = 20_000
    for i, tokens in enumerate(prompts):
        request = HarnessRequest(10_000_000 + i, tokens)
        sched.get_num_new_matched_tokens(request, 0)
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    assert len(whole) == len(c_calls) == n, (len(whole), len(c_calls))
    pairs = list(zip(whole, c_calls, strict=True))[200:]

    def stats(values: list[int]) -> str:
        ordered = sorted(values)
        return f"{ordered[len(ordered) // 2] / 1e3:6.1f} / {ordered[int(len(ordered) * 0.9)] / 1e3:6.1f}"

    print(
        f"{label:8s} {case:12s} p50 / p90 µs: align {stats([w for w, _ in pairs])}; sa_align {stats([c for _, c in pairs])}; "
        f"Python around it {stats([w - c for w, c in pairs])}"
    )


if __name__ == "__main__":
    main()
