"""The span path's timeline from the route12 probe's lines (``probe/sitecustomize.py``): each mark's time after the
request was parsed (p0), µs p50 / p90, and when Dynamo's runtime handed answers to the loop (``call_soon_threadsafe``
from its thread) against what the loop was doing then.

Usage: ``python benchmarks/results/route12/timeline_report.py <dir>/probe_<pid>.jsonl [--skip 10] [--count 150]``
"""

import argparse
import json

import numpy as np

MARKS = [
    ("l0", "load query asked"),
    ("x0", "exact query: call starts"),
    ("x1", "exact query: call returned"),
    ("s0", "span path starts"),
    ("n0", "compiled call starts"),
    ("n1", "compiled call ends"),
    ("s1", "span path ends (the loop awaits the exact answer)"),
    ("ldone", "load answer's callback ran"),
    ("xdone", "exact answer's callback ran"),
    ("m0", "semantic stage starts"),
    ("m1", "semantic stage ends"),
    ("d1", "decide returns"),
    ("h0", "hint starts"),
    ("h1", "hint written"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lines")
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--count", type=int, default=150)
    args = parser.parse_args()
    with open(args.lines) as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if "s1" in r and "xdone" in r and "p0" in r][args.skip : args.skip + args.count]
    print(f"{len(rows)} requests; µs after parse starts (p0), wall p50 / p90; CPU of the loop's thread p50")
    print("| mark | wall p50 | wall p90 | loop CPU p50 |")
    print("|---|---|---|---|")
    p = np.percentile
    for mark, name in MARKS:
        have = [r for r in rows if mark in r]
        if not have:
            continue
        wall = np.array([(r[mark][0] - r["p0"][0]) * 1e6 for r in have])
        cpu = np.array([(r[mark][1] - r["p0"][1]) * 1e6 for r in have])
        print(f"| {mark}: {name} | {p(wall, 50):.0f} | {p(wall, 90):.0f} | {p(cpu, 50):.0f} |")
    # hand-overs: the first two posts after x1 (the load and exact answers; the order is not known)
    where = {"before n0": 0, "during the compiled call": 0, "n1..s1": 0, "after s1": 0}
    post_after_x1, last_post_to_xdone = [], []
    for r in rows:
        posts = [t for t in r.get("posts", []) if t > r["x1"][0]]
        for t in posts[:2]:
            key = (
                "before n0"
                if t < r.get("n0", r["s1"])[0]
                else "during the compiled call"
                if t < r.get("n1", r["s1"])[0]
                else "n1..s1"
                if t < r["s1"][0]
                else "after s1"
            )
            where[key] += 1
        if posts:
            post_after_x1.append([(t - r["x1"][0]) * 1e6 for t in posts[:2]])
            before = [t for t in posts if t <= r["xdone"][0]]
            if before:
                last_post_to_xdone.append((r["xdone"][0] - before[-1]) * 1e6)
    print(f"\nthe first two hand-overs after x1, where the loop was: {where}")
    if post_after_x1:
        first = [x[0] for x in post_after_x1]
        second = [x[1] for x in post_after_x1 if len(x) > 1]
        print(
            f"hand-over after x1, µs p50: first {p(first, 50):.0f}, second {p(second, 50):.0f} "
            f"(p90 {p(first, 90):.0f}, {p(second, 90):.0f}); last hand-over before the exact callback -> callback: "
            f"p50 {p(last_post_to_xdone, 50):.0f}, p90 {p(last_post_to_xdone, 90):.0f}"
        )
    s1_to_x = np.array([(r["xdone"][0] - r["s1"][0]) * 1e6 for r in rows])
    s1_to_x_cpu = np.array([(r["xdone"][1] - r["s1"][1]) * 1e6 for r in rows])
    print(
        f"s1 -> exact callback: wall p50 {p(s1_to_x, 50):.0f}, p90 {p(s1_to_x, 90):.0f}; loop CPU p50 "
        f"{p(s1_to_x_cpu, 50):.0f}"
    )
    # the loop's callbacks between the end of the span path and the exact answer's callback
    count: dict[str, int] = {}
    cpu: dict[str, list[float]] = {}
    total = []
    for r in rows:
        spent = 0.0
        for name, start, _, used in r.get("cbs", []):
            if start < r["xdone"][0]:
                key = name.split(" at 0x")[0].split(" of <")[0][:60]
                count[key] = count.get(key, 0) + 1
                cpu.setdefault(key, []).append(used * 1e6)
                spent += used * 1e6
        total.append(spent)
    if count:
        print(
            f"\nloop callbacks run after s1 and before the exact answer's callback ran: CPU per request p50 "
            f"{p(total, 50):.0f}, p90 {p(total, 90):.0f} µs"
        )
        print("| callback | runs | CPU p50 µs | CPU sum ms |")
        print("|---|---|---|---|")
        for key, n in sorted(count.items(), key=lambda kv: -sum(cpu[kv[0]])):
            print(f"| `{key}` | {n} | {p(cpu[key], 50):.0f} | {sum(cpu[key]) / 1e3:.1f} |")


if __name__ == "__main__":
    main()
