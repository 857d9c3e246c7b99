"""``benchmarks/bench_route_decision.py``'s runs of two trees in turns (base, this, base, this, ...), each run its own
process, with every compiled module of both trees built beforehand (``--compare REF`` builds only the span aligner's
library), then its table.

Usage: ``python benchmarks/results/spans15/route_ab.py BASE_TREE --donors 20000 --requests 300 --rounds 3 --raw DIR``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_route_decision import STAGES, row  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("--donors", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--raw", default="")
    args = parser.parse_args()
    rows = []
    for turn in range(1, args.rounds + 1):
        for label, code in (("base", args.base), ("this", str(ROOT))):
            cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_route_decision.py"), "--child", "--code", code]
            cmd += ["--donors", str(args.donors), "--requests", str(args.requests)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1]
            rows.append(row(f"{label}, run {turn}", json.loads(out)))
            print(rows[-1], flush=True)
            if args.raw:
                Path(args.raw).mkdir(parents=True, exist_ok=True)
                (Path(args.raw) / f"{label}-{turn}.json").write_text(out)
    print(f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"# {args.donors:,} resident donors; {args.requests} sequential 8K span-path requests per run")
    print(
        "| code | "
        + " | ".join(f"{s} ms p50 / p99" for s in STAGES)
        + " | decide, glue max | > 5 ms | loop CPU | placed | setup s |"
    )
    print("|---|" + "---|" * (len(STAGES) + 5))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
