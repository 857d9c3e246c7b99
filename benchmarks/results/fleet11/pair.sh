#!/usr/bin/env bash
# A/B of the late replica, two trees in turns: bash pair.sh OUT BASE THIS ROUNDS MODE [ARGS...]
#   MODE breakdown: bench_replica_sync.py --breakdown ARGS (per-donor CPU of the add);
#   MODE converge:  bench_replica_sync.py --donors ARGS --baseline-donors --timeout 250 --sync-window 8.
# BASE and THIS: absolute paths of `git archive`d trees with their native aligner built; PYTHON picks the interpreter.
set -uo pipefail
out=$1 base=$2 this=$3 rounds=$4 mode=$5; shift 5
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for name in base this; do
    root=$([ "$name" = base ] && echo "$base" || echo "$this")
    if [ "$mode" = breakdown ]; then args=(--breakdown "$@"); else args=(--donors "$@" --baseline-donors --timeout 250 --sync-window 8); fi
    { echo "== $name round $round $(uptime)"; (cd "$root" && PYTHONPATH=$root ${PYTHON:-python3} benchmarks/bench_replica_sync.py "${args[@]}" 2>&1 | grep -v '^planner:\|^span aligner:'); } >> "$out/${mode}_${1}.txt"
  done
done
