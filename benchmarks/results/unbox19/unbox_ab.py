"""u32_prompt of this tree (the _unbox extension module) against a base tree's (main: the ctypes library), alternating
per decision in bench_connector's flow, in one process (adapted from dec19's experiments/unbox_ab.py).

Run from this tree's root with both trees' unboxing built (python -m trtllm_connector.unbox build in each):
    python benchmarks/results/unbox19/unbox_ab.py BASE_TREE [REQUESTS] [CASE]   (CASE: hit, shifted-hit, miss)
The base tree's trtllm_connector/unbox.py is imported as package ``base_tc`` (its own unbox.c and library, this tree's
semblend_dynamo); the scheduler's u32_prompt is the base's on even decisions and this tree's on odd ones. Prints each
variant's median (and p90, p99) of u32_prompt and of the whole get_num_new_matched_tokens, in µs, each variant's first 50 dropped.
"""

import argparse
import importlib
import random
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from trtllm_connector import connector as cm
from trtllm_connector import unbox
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

base = Path(sys.argv[1]).resolve()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1400
case = sys.argv[3] if len(sys.argv) > 3 else "hit"
package = types.ModuleType("base_tc")
package.__path__ = [str(base / "trtllm_connector")]
sys.modules["base_tc"] = package
base_unbox = importlib.import_module("base_tc.unbox")
for label, module in (("this", unbox), ("base", base_unbox)):
    print(
        f"{label}: {module.main.__module__} {'native' if module.u32_prompt.__defaults__[0] else 'fromlist'}: "
        f"{module.REASON}"
    )

args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
rng = random.Random(1)
cut = 8192 * 3 // 4
start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)


def prompt() -> list[int]:
    if start is None:
        return [rng.randrange(1, 32000) for _ in range(8192)]
    return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]


prompts = [prompt() for _ in range(n)]
ck = time.perf_counter_ns
variants = (base_unbox.u32_prompt, unbox.u32_prompt)
conv: dict[int, list[int]] = {0: [], 1: []}
dec: dict[int, list[int]] = {0: [], 1: []}
flag = [0]


def timed(tokens):
    f = variants[flag[0]]
    t0 = ck()
    out = f(tokens)
    conv[flag[0]].append(ck() - t0)
    return out


cm.u32_prompt = timed
block = 20000
for i, tokens in enumerate(prompts):
    flag[0] = i % 2
    req = HarnessRequest(10_000_000 + i, tokens)
    t0 = ck()
    sched.get_num_new_matched_tokens(req, 0)
    dec[flag[0]].append(ck() - t0)
    sched.update_state_after_alloc(req, list(range(block, block + 256)))
    block += 256
    sched.build_connector_meta(SchedulerOutput())
    sched.request_finished(req, [])


def q(values: list[int], p: float) -> float:
    s = sorted(values[50:])
    return s[min(len(s) - 1, int(p * len(s)))] / 1e3


for f, label in ((0, "base"), (1, "this")):
    print(
        f"{case} {label}: u32_prompt p50 {q(conv[f], 0.5):.1f} p90 {q(conv[f], 0.9):.1f} p99 {q(conv[f], 0.99):.1f}"
        f" | decision p50 {q(dec[f], 0.5):.1f} p90 {q(dec[f], 0.9):.1f} p99 {q(dec[f], 0.99):.1f} (µs)"
    )
