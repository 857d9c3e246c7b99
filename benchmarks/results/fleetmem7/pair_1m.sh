#!/usr/bin/env bash
# How fleetmem7's second 1M pair ran on the quiet VM: a baseline tree (a `git archive` of main, native aligner built)
# then this tree, one after the other, each from its own root.
#   bash benchmarks/results/fleetmem7/pair_1m.sh BASE_DIR OUT_DIR
set -uo pipefail
base=$1; out=$2; here=$(git rev-parse --show-toplevel)
mkdir -p "$out"
for tree in "$base" "$here"; do
  name=$([ "$tree" = "$here" ] && echo this || echo base)
  (cd "$tree" && PYTHONPATH="$tree" python benchmarks/bench_replica_sync.py --donors 1000000 --baseline-donors \
    --timeout 1200 --sync-window 8) > "$out/${name}_1m.txt" 2>&1
done
