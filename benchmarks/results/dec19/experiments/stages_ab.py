"""sa_align's stages in bench_connector's flow, variants alternating per decision (dec19). Needs a tree whose
span_aligner.c was instrumented by instrument.py (exports sa_times and sa_set_variant); run from that tree's root:
python stages_ab.py N hit|shifted-hit|miss 0,1 (variants: bit 1 bucket prefetch in the screen, 2 ring prefetch of the
filter, 4 filter swept before the screen, 8 screen run twice (the second timed), 16 branch-free first bit)."""

import argparse
import collections
import ctypes
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo import _native
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

n = int(sys.argv[1])
case = sys.argv[2]
variants = [int(v) for v in sys.argv[3].split(",")]
args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
lib = ctypes.CDLL(_native.library_path().as_posix())
lib.sa_times.restype = ctypes.POINTER(ctypes.c_uint64)
T = lib.sa_times()
rng = random.Random(1)
cut = 8192 * 3 // 4
start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)


def prompt():
    if start is None:
        return [rng.randrange(1, 32000) for _ in range(8192)]
    return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]


hits = [prompt() for _ in range(n)]
block = 20000
rows = collections.defaultdict(list)
for i, tokens in enumerate(hits):
    v = variants[i % len(variants)]
    lib.sa_set_variant(ctypes.c_int64(v))
    req = HarnessRequest(10_000_000 + i, tokens)
    w0 = time.perf_counter_ns()
    sched.get_num_new_matched_tokens(req, 0)
    w1 = time.perf_counter_ns()
    if i >= 200:
        s = [T[k] for k in range(8)]
        st = [
            s[1] - s[0],
            s[2] - s[1],
            s[3] - s[2],
            s[4] - s[3],
            (s[5] - s[4]) if s[5] else 0,
            (s[6] - s[5]) if s[6] else 0,
        ]
        rows[v].append(([*st, sum(st)], (w1 - w0) / 1e3))
    sched.update_state_after_alloc(req, list(range(block, block + 256)))
    block += 256
    sched.build_connector_meta(SchedulerOutput())
    sched.request_finished(req, [])
TSC_MHZ = float(__import__("os").environ.get("TSC_MHZ", "2445.4"))  # the TSC rate (the VM's: dmesg "tsc: Detected")
names = ["screen", "idfind", "hitrows", "diag", "slots", "runs", "sum"]
print("variant " + " ".join(f"{nm:>8s}" for nm in names) + "   dec_p50  dec_p90")
for v in variants:
    r = rows[v]
    med = [statistics.median(x[0][k] for x in r) / TSC_MHZ for k in range(7)]
    w = sorted(x[1] for x in r)
    print(f"{v:7d} " + " ".join(f"{m:8.2f}" for m in med) + f"  {w[len(w) // 2]:8.1f} {w[int(len(w) * 0.9)]:8.1f}")
