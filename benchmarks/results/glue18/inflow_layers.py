"""The aligner's layers timed inside whole decisions, on this branch's compiled call (glue18; as sched17's align_in_flow).

``python benchmarks/results/glue18/inflow_layers.py N`` from this tree's root: bench_connector's scheduler (8K prompts,
~10K pinned blocks, shifted mode, hits) with ``array_address``, the planner module's ``spans`` (``C spans()``),
``AlignCall.spans``, ``_native_align``, ``align`` and ``_find_spans`` wrapped; medians (µs) and calls per decision
(x1000) after the first 200 decisions. Written to find what remained around the compiled call after its first commit.
"""

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo import _native, span_aligner
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

clock = time.perf_counter_ns
n = int(sys.argv[1])
args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
cur = collections.defaultdict(int)
acc = collections.defaultdict(list)
raw = span_aligner.NATIVE_SPANS


def build(*a):
    t = clock()
    out = raw(*a)
    cur["C spans()"] += clock() - t
    return out


span_aligner.NATIVE_SPANS = build


def wrap(obj, name):
    f = getattr(obj, name)

    def timed(*a, **k):
        t = clock()
        out = f(*a, **k)
        cur[name] += clock() - t
        cur[name + " calls"] += 1000
        return out

    setattr(obj, name, timed)


wrap(_native, "array_address")
wrap(sched, "_find_spans")
wrap(sched.aligner, "align")
wrap(sched.aligner, "_native_align")
wrap(sched.aligner._call, "spans")
rng = random.Random(1)
cut = 8192 * 3 // 4
block = 20000
for i in range(n):
    request = HarnessRequest(
        10_000_000 + i, rng.choice(donors)[0:cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]
    )
    cur.clear()
    sched.get_num_new_matched_tokens(request, 0)
    if i >= 200:
        for k, v in cur.items():
            acc[k].append(v)
    sched.update_state_after_alloc(request, list(range(block, block + 256)))
    block += 256
    sched.build_connector_meta(SchedulerOutput())
    sched.request_finished(request, [])
for k, v in acc.items():
    print(f"{sorted(v)[len(v) // 2] / 1e3:7.2f}  {k}")
