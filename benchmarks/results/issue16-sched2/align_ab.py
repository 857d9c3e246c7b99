"""A/B of two span aligners, interleaved in one process (warm): 39 donors of 8K tokens, 8K targets.

``python align_ab.py MAIN_SPAN_ALIGNER_PY [THIS_SPAN_ALIGNER_PY]``: the first file is loaded as "main", the second
(default: this tree's) as "branch"; both must return the same spans.
"""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
import time
from types import ModuleType

import numpy as np


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    mine = sys.argv[2] if len(sys.argv) > 2 else "semblend_dynamo/span_aligner.py"
    modules = {"main": load(sys.argv[1], "al_main"), "branch": load(mine, "al_branch")}
    rng = random.Random(0)
    donors = [[rng.randrange(1, 32000) for _ in range(8192)] for _ in range(39)]
    aligners = {}
    for name, module in modules.items():
        aligner = module.SpanAligner(32, 32)
        for i, tokens in enumerate(donors):
            arr = np.array(tokens, dtype=np.int64)
            arr.flags.writeable = False  # as the connector's donor registry hands them over
            aligner.add_donor(f"0:{i}", "ns", arr)
        aligners[name] = aligner
    fresh = [rng.randrange(1, 32000) for _ in range(2048)]
    cases = {
        "miss": [rng.randrange(1, 32000) for _ in range(8192)],
        "hit": donors[3][:6144] + fresh,
        "shifted": donors[3][40 : 40 + 6144] + fresh,
    }
    for case, prompt in cases.items():
        target = np.array(prompt, dtype=np.int64)
        for candidates in (None, ["0:3"]):
            answers = {
                name: [
                    (s.donor_id, s.donor_start, s.target_start, s.length)
                    for s in a.align("ns", target, candidates=candidates)
                ]
                for name, a in aligners.items()
            }
            assert answers["main"] == answers["branch"], case
            times: dict[str, list[float]] = {name: [] for name in aligners}
            for _ in range(300):
                for name, aligner in aligners.items():
                    t0 = time.perf_counter()
                    aligner.align("ns", target, candidates=candidates)
                    times[name].append((time.perf_counter() - t0) * 1e6)
            shown = " ".join(f"{k} p50 {statistics.median(v):.1f} min {min(v):.1f}" for k, v in times.items())
            print(case, "hinted" if candidates else "", shown)


if __name__ == "__main__":
    main()
