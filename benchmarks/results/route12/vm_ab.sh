#!/usr/bin/env bash
# vm_ab.sh OUT DONORS REQS ROUNDS BASE_TREE: route10's vm_ab.sh with route12's probe (the answers' hand-overs, the loop's
# callbacks after the span path, the semantic stage marked): the Frontend benchmark on BASE_TREE (a main tree with its
# compiled modules built) and on this checkout in turns (base first in odd rounds, this first in even ones); each run's
# table in OUT/frontend_<round>_<tree>.txt, its probe lines in OUT/probe_<round>_<tree>/ and both reports
# (route10's span_probe_report.py, route12's timeline_report.py) in OUT/probe_<round>_<tree>.md. Run from the repo root.
set -u
out=$1; donors=$2; reqs=$3; rounds=$4; base=$5
here=$PWD
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="base this"; else order="this base"; fi
  for t in $order; do
    root=$([ "$t" = base ] && echo "$base" || echo "$here")
    mkdir -p "$out/probe_${r}_$t"
    (cd "$root" && ROUTE10_PROBE="$out/probe_${r}_$t" PYTHONPATH="$root:$here/benchmarks/results/route12/probe" \
      timeout 900 python -m benchmarks.frontend_path.run --donors "$donors" --requests "$reqs") \
      > "$out/frontend_${r}_$t.txt" 2>&1
    echo "== round $r $t rc=$? $(uptime)"
    grep -E "total_added|spans\`|exact\`|semantic\`|hint\`|decide\`" "$out/frontend_${r}_$t.txt"
    for f in "$out/probe_${r}_$t"/probe_*.jsonl; do
      { python benchmarks/results/route10/span_probe_report.py "$f" --count "$reqs"; echo;
        python benchmarks/results/route12/timeline_report.py "$f" --count "$reqs"; } > "$out/probe_${r}_$t.md"
      gzip -f "$f"
    done
  done
done
