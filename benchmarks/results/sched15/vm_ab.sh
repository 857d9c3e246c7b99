#!/usr/bin/env bash
# VM A/B (sched15): sched4's decide_steps.py in the base tree (argument 1) and this tree, alternating, ROUNDS rounds
# (argument 2, default 3) of a shifted-mode shifted hit and an exact-mode hit; prints each run's sum-per-decision p50/p99.
set -uo pipefail
base_tree=$1
rounds=${2:-3}
here=$PWD
for run in $(seq 1 "$rounds"); do
  order="base here"
  [ $((run % 2)) -eq 0 ] && order="here base"
  for tree in $order; do
    for mc in "shifted shifted-hit" "exact hit"; do
      dir=$([ "$tree" = base ] && echo "$base_tree" || echo "$here")
      line=$(cd "$dir" && PYTHONPATH=$dir python "$here/benchmarks/results/sched4/decide_steps.py" 1200 $mc | grep "sum of medians")
      echo "round $run $tree $mc: $line"
    done
  done
done
