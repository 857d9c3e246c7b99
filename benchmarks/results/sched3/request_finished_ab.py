"""``request_finished`` of a decided 8K request that becomes a donor (admission, LRU eviction, aligner), p50 of 300.

``python benchmarks/results/sched3/request_finished_ab.py`` from a tree's root (its ``benchmarks/`` and packages on the
path), once per tree: bench_connector's scheduler (~10K pinned blocks, exact mode); each request is decided, allocated,
planned, then finished with its blocks (timed) and pinned, which releases the least recently used donor.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest


def main() -> None:
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=10, mode="exact", audit="file")
    sched, _ = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    rng = random.Random(5)
    block = 100_000
    out = []
    for i in range(300):
        request = HarnessRequest(20_000_000 + i, [rng.randrange(1, 32000) for _ in range(8192)])
        sched.get_num_new_matched_tokens(request, 0)
        blocks = list(range(block, block + 256))
        block += 256
        sched.update_state_after_alloc(request, blocks)
        sched.build_connector_meta(SchedulerOutput())
        t0 = time.perf_counter_ns()
        pinned = sched.request_finished(request, blocks)
        out.append((time.perf_counter_ns() - t0) / 1e3)
        assert pinned
        sched.build_connector_meta(SchedulerOutput())
    p90 = sorted(out)[int(0.9 * len(out))]
    print(f"request_finished (pins an 8K donor, evicts one) p50 {statistics.median(out):.0f} µs, p90 {p90:.0f}")


if __name__ == "__main__":
    main()
