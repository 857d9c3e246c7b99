"""The connector's span search at both token widths, in one process and one flow, decisions alternating.

``python benchmarks/results/sched5/aligner_width_ab.py [shifted-hit|hit|miss]`` from a sched5 tree's root: builds
bench_connector's shifted-mode scheduler (8K prompts, ~10K pinned blocks) and a second, int64 span aligner holding the
same donors as int64 copies (main's before sched5: the prompt converted to int64 per decision); even decisions search
with the connector's uint32 aligner, odd ones with the int64 one. Prints ``_find_spans`` (the conversion included)
per width: p50, p90, p99 in µs over 3,000 decisions (the first 100 left out).
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

import numpy as np

sys.path.insert(0, "benchmarks")
import bench_connector as bc

import trtllm_connector.connector as cm
from semblend_dynamo.span_aligner import Span, SpanAligner
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest


def main() -> None:
    case = sys.argv[1] if len(sys.argv) > 1 else "shifted-hit"
    n = 3000
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    narrow = sched.aligner
    wide = SpanAligner(narrow.block_size, narrow.min_span_tokens)
    for d in sched.registry.donors():
        copy = d.tokens.astype(np.int64)
        copy.flags.writeable = False
        wide.add_donor(d.donor_id, d.namespace_digest, copy)
    scheduler = cm.SemBlendConnectorScheduler
    own_align, own_find = scheduler._align, scheduler._find_spans

    def align_wide(self: Any, namespace: str, prompt: np.ndarray, candidates: list[str] | None) -> list[Span]:
        return wide.align(namespace, prompt.astype(np.int64), candidates=candidates, max_spans=self.cfg.max_spans)

    times: dict[str, list[int]] = collections.defaultdict(list)
    width = ["u32"]

    def find(self: Any, *a: Any) -> Any:
        t0 = time.perf_counter_ns()
        out = own_find(self, *a)
        times[width[0]].append(time.perf_counter_ns() - t0)
        return out

    scheduler._find_spans = find  # type: ignore[method-assign]
    rng = random.Random(1)
    cut, block = 6144, 20_000
    start = {"hit": 0, "shifted-hit": 40}.get(case)
    for i in range(n):
        width[0] = "u32" if i % 2 == 0 else "int64"
        scheduler._align = own_align if i % 2 == 0 else align_wide  # type: ignore[method-assign]
        fresh = [rng.randrange(1, 32000) for _ in range(8192 if start is None else 8192 - cut)]
        tokens = fresh if start is None else rng.choice(donors)[start : start + cut] + fresh
        request = HarnessRequest(10_000_000 + i, tokens)
        sched.get_num_new_matched_tokens(request, 0)
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    for name, v in sorted(times.items()):
        v = sorted(v[100:])
        p50, p90, p99 = (v[int(len(v) * q)] / 1e3 for q in (0.5, 0.9, 0.99))
        print(f"{case} {name:6s} _find_spans p50 {p50:6.1f}  p90 {p90:6.1f}  p99 {p99:7.1f}")


if __name__ == "__main__":
    main()
