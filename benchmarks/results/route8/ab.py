"""``bench_route_decision.py``'s child run on several exported trees in turns (round-robin, each run its own process),
so that several variants are compared in one session on a shared VM. Prints the benchmark's table and writes each
run's raw JSON under ``--raw``.

Usage: ``python benchmarks/results/route8/ab.py --tree main=/tmp/base --tree route8=/tmp/v1 --rounds 3 -- --donors
20000 --requests 300 --runtime-ms 0.4 --serve-donors``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench_route_decision.py"
sys.path.insert(0, str(BENCH.parent))

from bench_route_decision import SLOW_MS, STAGES, row  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tree", action="append", required=True, help="label=path of an exported tree (native built)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--raw", default="")
    p.add_argument("child", nargs=argparse.REMAINDER)
    args = p.parse_args()
    child = [a for a in args.child if a != "--"]
    rows = []
    for turn in range(1, args.rounds + 1):
        for spec in args.tree:
            label, code = spec.split("=", 1)
            env = dict(os.environ, PYTHONPATH=code)
            cmd = [sys.executable, str(BENCH), "--child", "--code", code, *child]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.splitlines()[-1]
            result = json.loads(out)
            ahead = sum(1 for us in result["stages_us"]["spans"] if us > 0)
            rows.append(
                row(f"{label}, run {turn}", result)
                + f" searched ahead {ahead}/{result['requests']}, gate unsure {result.get('gate_unsure')} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
            if args.raw:
                Path(args.raw).mkdir(parents=True, exist_ok=True)
                (Path(args.raw) / f"{label}-{turn}.json").write_text(out)
    print(f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"# child args: {' '.join(child)}; load after: {os.getloadavg()[0]:.1f}")
    print()
    print(
        "| code | "
        + " | ".join(f"{stage} ms p50 / p99" for stage in STAGES)
        + f" | decide, glue max ms | decide > {SLOW_MS:.0f} ms | loop CPU ms per request | placed | setup s |"
    )
    print("|---|" + "---|" * (len(STAGES) + 5))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
