#!/usr/bin/env bash
# gate_ab.sh [BASE] [ROUNDS]: session 19's exact-wins gate read (gate_ab.py: 8 ranks x 50K blocks, then 4 ranks x 200K)
# in the base tree (default /tmp/tree-base) and this checkout, in turns, after building both trees' span aligner library
# and planner module for this Python. DEPS_PATH (default /tmp/semdev/site:/tmp/pr, the device staging's) goes after
# each tree on PYTHONPATH.
set -uo pipefail
base=${1:-/tmp/tree-base}; rounds=${2:-3}; here=$PWD
deps=${DEPS_PATH:-/tmp/semdev/site:/tmp/pr}
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; }
for root in "$base" "$here"; do
  for module in semblend_dynamo._native semblend_dynamo.native_planner; do
    (cd "$root" && PYTHONPATH=$root:$deps python3 -m $module build >/dev/null 2>&1) || echo "== $root: $module build failed"
  done
done
for shape in "8 50000 3000" "4 200000 3000"; do
  for r in $(seq "$rounds"); do
    for root in "$base" "$here"; do
      PYTHONPATH=$root:$deps python3 "$here/benchmarks/results/gate19/gate_ab.py" "$root" $shape
    done
  done
done
