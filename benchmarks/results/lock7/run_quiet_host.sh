#!/usr/bin/env bash
# Session 10 (lock7): the in-process measurements again on a quiet host, this tree against a git ref (default main),
# each pair in the same run. From the repository root, with the environment the benchmarks need (Dynamo's bindings):
#   bash benchmarks/results/lock7/run_quiet_host.sh [REF] > lock7_quiet_host.txt 2>&1
# Prints: the route-decision A/B (3 runs each, in turns), the decide-tail trace (lock holds, wall and thread CPU) of
# the ref's tree then this one's, and the block map's longest single change for both. ~45 min at 100K donors.
set -euo pipefail
ref="${1:-main}"
base="$(mktemp -d)"
trap 'rm -rf "$base"' EXIT
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from router_under_test import export_ref; export_ref('$ref', '$base')"
{ uptime; nproc; lscpu | grep -i "model name" || true; python3 -V; } 2>&1
echo "## route decision, 100K served donors, $ref against this tree"
python3 benchmarks/bench_route_decision.py --donors 100000 --requests 300 --repeat 3 --runtime-ms 0.4 \
  --serve-donors --compare "$ref"
for tree in "$base" "$PWD"; do
  echo "## decide tail: $tree"
  python3 benchmarks/results/lock7/decide_tail.py --donors 100000 --code "$tree"
done
echo "## block map changes, 1.6M entries"
benchmarks/results/lock7/u64map_pause_ab.sh "$base" --entries 1600000 \
  --changes 100000
