"""Medians over rounds of bench_connector outputs named ``<tree>_<mode>_run<N>.txt`` in a folder.

``python benchmarks/results/sched4/summarize_ab.py FOLDER``: one row per mode and case, per tree the median over its
runs of the p50, the p99 and the CPU p99 (µs), and the runs' p50s, plus the load averages the runs printed.
"""

from __future__ import annotations

import collections
import re
import statistics
import sys
from pathlib import Path


def main() -> None:
    folder = Path(sys.argv[1])
    rows: dict[tuple[str, str], dict[str, list[tuple[float, float, float]]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    loads: list[str] = []
    trees: list[str] = []
    for path in sorted(folder.glob("*_run*.txt")):
        match = re.fullmatch(r"(.+)_(exact|shifted)_run\d+\.txt", path.name)
        if match is None:
            continue
        tree, mode = match.groups()
        if tree not in trees:
            trees.append(tree)
        for line in path.read_text().splitlines():
            if line.startswith("load average"):
                loads.append(line.split(": ", 1)[1].split(" / ")[0])
            cells = [c.strip() for c in line.split("|")[1:-1]]
            if len(cells) < 7 or not cells[0].startswith("SemBlend"):
                continue
            cpu99 = float(cells[6].split("/")[1])
            rows[(mode, cells[0])][tree].append((float(cells[3]), float(cells[4]), cpu99))
    print(f"load average (1 min) at the end of the runs: {min(loads, key=float)}-{max(loads, key=float)}")
    head = " | ".join(f"{t} p50 / p99 / CPU p99 (median), p50 per run" for t in trees)
    print(f"| mode | case | {head} |")
    print("|---|---|" + "---|" * len(trees))
    for (mode, case), by_tree in rows.items():
        cells = []
        for tree in trees:
            runs = by_tree.get(tree, [])
            if not runs:
                cells.append("-")
                continue
            p50, p99, cpu99 = (statistics.median(r[i] for r in runs) for i in range(3))
            each = ", ".join(f"{r[0]:.0f}" for r in runs)
            cells.append(f"{p50:.0f} / {p99:.0f} / {cpu99:.0f} ({each})")
        print(f"| {mode} | {case.removeprefix('SemBlend, ')} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
