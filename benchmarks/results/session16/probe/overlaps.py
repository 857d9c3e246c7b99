"""Which background work ran inside the slowest decisions (session 16): from route12's probe lines, each sequential
request's time from parse to hint written, and the background runs (``bg``: kind and thread) whose time overlapped it,
for the fastest half, the 90th-98th percentiles and the slowest 2%.

Usage: ``python benchmarks/results/session16/probe/overlaps.py PROBE.jsonl[.gz] [--skip 20] [--count 800]`` (the
sequential requests: the warm-up's lines come before them, the concurrent case's after).
"""

import argparse
import gzip
import json
import statistics
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("probe")
    parser.add_argument("--skip", type=int, default=20)
    parser.add_argument("--count", type=int, default=800)
    args = parser.parse_args()
    opener = gzip.open if args.probe.endswith(".gz") else open
    with opener(args.probe, "rt") as f:
        rows = [json.loads(line) for line in f][args.skip : args.skip + args.count]
    timed = []
    for r in rows:
        if "p0" in r and "h1" in r:
            start, end = r["p0"][0], r["h1"][0]
            inside = sorted({f"{b[0]} ({b[1]})" for b in r.get("bg", []) if b[2] < end and b[3] > start})
            timed.append(((end - start) * 1e6, inside))
    timed.sort(key=lambda t: t[0])
    n = len(timed)
    print(f"{n} requests, parse -> hint written; background runs overlapping each group's decisions")
    print("| group | requests | p50 (us) | with an overlap | overlapping runs by kind (thread) |")
    print("|---|---|---|---|---|")
    for name, group in (
        ("fastest half", timed[: n // 2]),
        ("90th-98th percentile", timed[int(0.9 * n) : int(0.98 * n)]),
        ("slowest 2%", timed[int(0.98 * n) :]),
    ):
        kinds = Counter(k for _, inside in group for k in inside)
        hit = sum(1 for _, inside in group if inside)
        p50 = statistics.median(t for t, _ in group)
        print(f"| {name} | {len(group)} | {p50:.0f} | {hit} | {dict(kinds) or '-'} |")


if __name__ == "__main__":
    main()
