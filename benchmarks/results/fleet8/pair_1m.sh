#!/usr/bin/env bash
# How fleet8's 1M pair ran: each tree a `git archive` with the native aligner built, from its own root, in the order
# given (base = main, this = this branch); PYTHON (default python3) runs them.
#   bash benchmarks/results/fleet8/pair_1m.sh OUT_DIR BASE_DIR THIS_DIR
set -uo pipefail
out=$1; base=$2; this=$3
mkdir -p "$out"
for tree in "$base" "$this"; do
  name=$([ "$tree" = "$this" ] && echo this || echo base)
  (cd "$tree" && PYTHONPATH="$tree" "${PYTHON:-python3}" benchmarks/bench_replica_sync.py --donors 1000000 --baseline-donors \
    --timeout 1200 --sync-window 8) > "$out/${name}_1m.txt" 2>&1
done
