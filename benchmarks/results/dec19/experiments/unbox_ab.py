"""u32_prompt through ctypes (unbox.c, main) against an extension-module function (unbox_ext.c here), alternating per
decision in bench_connector's flow (dec19). Build: cc -O2 -fPIC -shared -I<python include> -o unbox_ext<ext suffix>
unbox_ext.c beside this file; run from a tree's root: python benchmarks/results/dec19/experiments/unbox_ab.py 1400 hit."""

import argparse
import array
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
sys.path.insert(0, str(Path(__file__).parent))
import bench_connector as bc
import unbox_ext

from trtllm_connector import connector as cm
from trtllm_connector import unbox
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

unbox_ext.setup(array.array("I", [0]))
n = int(sys.argv[1])
case = sys.argv[2]
args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
rng = random.Random(1)
cut = 8192 * 3 // 4
start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)


def prompt():
    if start is None:
        return [rng.randrange(1, 32000) for _ in range(8192)]
    return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]


hits = [prompt() for _ in range(n)]
ck = time.perf_counter_ns
orig = unbox.u32_prompt
acc = {0: [], 1: []}
dec = {0: [], 1: []}
flag = [0]


def ext(toks):
    out = unbox_ext.u32(toks)
    return out if out is not None else orig(toks)


def v(toks):
    f = ext if flag[0] else orig
    t0 = ck()
    out = f(toks)
    acc[flag[0]].append(ck() - t0)
    return out


cm.u32_prompt = v
block = 20000
for i, tokens in enumerate(hits):
    flag[0] = i % 2
    req = HarnessRequest(10_000_000 + i, tokens)
    t0 = ck()
    sched.get_num_new_matched_tokens(req, 0)
    dec[flag[0]].append(ck() - t0)
    sched.update_state_after_alloc(req, list(range(block, block + 256)))
    block += 256
    sched.build_connector_meta(SchedulerOutput())
    sched.request_finished(req, [])
for f in (0, 1):
    print(
        "ext" if f else "ctypes",
        statistics.median(acc[f][100:]) / 1e3,
        "decision",
        statistics.median(dec[f][100:]) / 1e3,
    )
