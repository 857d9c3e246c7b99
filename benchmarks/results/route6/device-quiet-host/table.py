"""The device runs' raw JSON (stand-in 0.4 ms, and 0.15 ms: files ending -rt0.15) (bench_route_decision.py children) as that benchmark's table, plus tail counts."""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench_route_decision import STAGES, row

here = Path(__file__).parent
print("| code | " + " | ".join(f"{s} ms p50 / p99" for s in STAGES) + " | loop CPU ms per request | placed | setup s |")
print("|---|" + "---|" * (len(STAGES) + 3))
for suffix, runs in (
    ("", (("20k", 1), ("20k", 2), ("100k", 1), ("100k", 2))),
    ("-rt0.15", (("20k", 1), ("100k", 1), ("100k", 2))),
):
    for donors, run in runs:
        for side, label in (("before", "b712f58 (before)"), ("after", "route6 (after)")):
            result = json.loads((here / f"{side}-{donors}-{run}{suffix}.json").read_text().splitlines()[-1])
            donors_label = f"{donors}, stand-in {'0.15' if suffix else '0.4'} ms"
            total = np.asarray(result["stages_us"]["total_added"])
            print(
                row(
                    f"{donors_label}, {label}, run {run} (native {result['native_aligner']}, >2 ms: {(total > 2000).sum()})",
                    result,
                )
            )
