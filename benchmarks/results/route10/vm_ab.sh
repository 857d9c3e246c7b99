#!/usr/bin/env bash
# vm_ab.sh OUT DONORS REQS ROUNDS BASE_TREE: the Frontend benchmark with the span-path probe, on BASE_TREE (a main
# tree with its compiled modules built) and on this checkout in turns (base first in odd rounds, this first in even
# ones), each run's table in OUT/frontend_<round>_<tree>.txt and its probe lines in OUT/probe_<round>_<tree>/.
# Run from the repo root; report: benchmarks/results/route10/span_probe_report.py OUT/probe_<r>_<t>/probe_*.jsonl.
set -u
out=$1; donors=$2; reqs=$3; rounds=$4; base=$5
here=$PWD
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="base this"; else order="this base"; fi
  for t in $order; do
    root=$([ "$t" = base ] && echo "$base" || echo "$here")
    mkdir -p "$out/probe_${r}_$t"
    (cd "$root" && ROUTE10_PROBE="$out/probe_${r}_$t" PYTHONPATH="$root:$here/benchmarks/results/route10/probe" \
      timeout 900 python -m benchmarks.frontend_path.run --donors "$donors" --requests "$reqs") \
      > "$out/frontend_${r}_$t.txt" 2>&1
    echo "== round $r $t rc=$? $(uptime)"
    grep -E "total_added|spans\`|exact\`|hint\`|decide\`" "$out/frontend_${r}_$t.txt"
  done
done
