"""The device runs' raw JSON (bench_route_decision.py children) as that benchmark's table, plus tail counts."""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench_route_decision import STAGES, row  # noqa: E402

here = Path(__file__).parent
print("| code | " + " | ".join(f"{s} ms p50 / p99" for s in STAGES) + " | loop CPU ms per request | placed | setup s |")
print("|---|" + "---|" * (len(STAGES) + 3))
for donors in ("20k", "100k"):
    for run in (1, 2):
        for side, label in (("before", "b712f58 (before)"), ("after", "route6 (after)")):
            result = json.loads((here / f"{side}-{donors}-{run}.json").read_text().splitlines()[-1])
            total = np.asarray(result["stages_us"]["total_added"])
            print(row(f"{donors}, {label}, run {run} (native {result['native_aligner']}, >2 ms: {(total > 2000).sum()})", result))
