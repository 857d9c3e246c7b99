"""Where the kernel spends the audit's ``os.write``: ``perf script -F ip,sym`` samples read from stdin.

``perf record -F 20000 -e cpu-clock -g -o perf.data -- python benchmarks/results/audit20/write_steps.py 1500 shifted
hit`` then ``perf script -i perf.data -F ip,sym | python benchmarks/results/audit20/kernel_write_profile.py``: of the
samples whose stack holds ``ksys_write``, the share of each function below it (inclusive) and of the leaf functions.
"""

from __future__ import annotations

import collections
import sys


def main() -> None:
    total = 0
    below: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    for stack in sys.stdin.read().split("\n\n"):
        frames = [
            line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else "?" for line in stack.strip().splitlines()
        ]
        top = next((i for i, f in enumerate(frames) if f.startswith("ksys_write")), None)
        if top is None:
            continue
        total += 1
        leaf[frames[0]] += 1
        for f in set(frames[:top]):
            below[f] += 1
    print(f"{total} samples in ksys_write")
    for name, count in below.most_common(30):
        print(f"{100 * count / total:5.1f}%  {name}")
    print("leaves:")
    for name, count in leaf.most_common(10):
        print(f"{100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
