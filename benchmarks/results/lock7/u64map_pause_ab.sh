#!/usr/bin/env bash
# bench_u64map_pause.py with the base tree's U64Map and this tree's, in turns, 3 rounds (A/B in one run).
# Usage: benchmarks/results/lock7/u64map_pause_ab.sh BASE_TREE [--entries 1600000 --changes 100000]
set -euo pipefail
here="$(cd "$(dirname "$0")/../../.." && pwd)"
base="$1"; shift
for round in 1 2 3; do
  for tree in "$base" "$here"; do
    echo "## round $round: $tree"
    PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" python3 "$here/benchmarks/bench_u64map_pause.py" "$@"
  done
done
