"""The span search's layers timed inside whole decisions (sched17).

``python benchmarks/results/sched17/align_in_flow.py N exact|shifted hit|shifted-hit|miss`` from a tree's root:
bench_connector's scheduler (8K prompts, ~10K pinned blocks, audit to a file) and per-request settle calls, as
sched15's ``sub_steps.py``; the compiled ``sa_align`` call, ``AlignCall.run`` (its Python around it), ``_spans_of``,
``SpanAligner.align`` and the scheduler's ``_find_spans`` each timed with ``perf_counter_ns``; prints each one's median
(µs) over the decisions after the first 200.
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

from semblend_dynamo import _native
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

clock = time.perf_counter_ns


def main() -> None:
    n, mode, case = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    cur: dict[str, int] = collections.defaultdict(int)
    acc: dict[str, list[int]] = collections.defaultdict(list)
    library = _native.LIBRARY
    assert library is not None, _native.REASON
    raw_align = library.sa_align

    def timed_call(f: Any) -> Any:
        def call(address: int) -> int:
            t = clock()
            out: int = f(address)
            cur["sa_align"] += clock() - t
            return out

        return call

    class Library:
        """The loaded library with ``sa_align`` timed (its other functions as they are)."""

        sa_align = staticmethod(timed_call(raw_align))

        def __getattr__(self, name: str) -> Any:
            return getattr(library, name)

    _native.LIBRARY = Library()  # type: ignore[assignment]
    _native._SA_ALIGN_HELD = timed_call(_native._SA_ALIGN_HELD)

    def wrap(obj: Any, name: str) -> None:
        f = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t = clock()
            out = f(*a, **k)
            cur[name] += clock() - t
            return out

        setattr(obj, name, timed)

    wrap(sched, "_find_spans")
    wrap(sched.aligner, "align")
    wrap(sched.aligner, "_spans_of")
    if sched.aligner._call is not None:
        wrap(sched.aligner._call, "run")
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    block = 20_000
    for i in range(n):
        request = HarnessRequest(10_000_000 + i, prompt())
        cur.clear()
        sched.get_num_new_matched_tokens(request, 0)
        if i >= 200:
            for k, v in cur.items():
                acc[k].append(v)
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    for name, times in acc.items():
        print(f"{sorted(times)[len(times) // 2] / 1e3:7.2f}  {name}")


if __name__ == "__main__":
    main()
