"""Report of the span-path probe's lines (``probe/sitecustomize.py``): per step, wall and thread-CPU p50 and wall
minus CPU (time the loop's thread did not run: GIL waits, preemption), µs; then when the loop ran Dynamo's answers.

Usage: ``python benchmarks/results/route10/span_probe_report.py <dir>/probe_<pid>.jsonl [--skip 10] [--count 300]``
"""

import argparse
import json

import numpy as np

STEPS = [
    ("s0", "g0", "into the gate"),
    ("g0", "st0", "gate: Dynamo's hash of 2 blocks"),
    ("st0", "st1", "gate: stored_together"),
    ("st1", "g1", "gate: rest"),
    ("g1", "f0", "to find_spans"),
    ("f0", "a0", "find_spans: target, digest, lock"),
    ("a0", "n0", "align: checks, views"),
    ("n0", "n1", "the compiled call"),
    ("n1", "a1", "align: Span objects"),
    ("a1", "s1", "find_spans out"),
    ("s0", "s1", "whole `spans` stage"),
    ("x0", "x1", "asking the exact query (the call)"),
    ("h0", "h1", "hint"),
    ("p0", "h1", "parse to hint written"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lines")
    parser.add_argument("--skip", type=int, default=10, help="warm-up requests left out")
    parser.add_argument("--count", type=int, default=300, help="the sequential requests after them (not the burst)")
    args = parser.parse_args()
    with open(args.lines) as f:
        lines = [json.loads(line) for line in f]
    lines = [r for r in lines if "s1" in r and "a1" in r][args.skip : args.skip + args.count]
    print(f"{len(lines)} requests")
    print("| step | wall p50 | wall p90 | CPU p50 | wall - CPU p50 | wall - CPU p90 |")
    print("|---|---|---|---|---|---|")
    for a, b, name in STEPS:
        if not all(a in r and b in r for r in lines):
            continue
        wall = np.array([(r[b][0] - r[a][0]) * 1e6 for r in lines])
        cpu = np.array([(r[b][1] - r[a][1]) * 1e6 for r in lines])
        p = np.percentile
        print(
            f"| {name} | {p(wall, 50):.1f} | {p(wall, 90):.1f} | {p(cpu, 50):.1f} | {p(wall - cpu, 50):.1f} | "
            f"{p(wall - cpu, 90):.1f} |"
        )
    done = [r for r in lines if "xdone" in r and "ldone" in r]
    if done:

        def med(a: str, b: str) -> float:
            return float(np.median([(r[b][0] - r[a][0]) * 1e6 for r in done]))

        print(
            f"\nanswers ({len(done)} requests), µs p50: load query asked -> its callback ran {med('l0', 'ldone'):.0f}; "
            f"exact query asked -> its callback ran {med('x1', 'xdone'):.0f}; end of the span path (s1) -> exact "
            f"callback {med('s1', 'xdone'):.0f}, -> load callback {med('s1', 'ldone'):.0f}; answers run before s1: "
            f"{sum(r['xdone'][0] < r['s1'][0] for r in done)} (exact), {sum(r['ldone'][0] < r['s1'][0] for r in done)}"
            " (load)"
        )
    overlap: dict[str, int] = {}
    for r in lines:
        for name, _, start, end, _ in r["bg"]:
            if min(end, r["s1"][0]) > max(start, r["s0"][0]):
                overlap[name] = overlap.get(name, 0) + 1
    print(f"requests whose span path overlapped background work: {overlap or 'none'}")


if __name__ == "__main__":
    main()
