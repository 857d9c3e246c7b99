#!/usr/bin/env bash
# Issue 16.2 (screen18): the span screen of this checkout against a base tree's (main), on one host, ~4 minutes:
#   bash benchmarks/results/screen18/screen_ab.sh [ROUNDS] [BASE_TREE]   (defaults 4, /tmp/tree-base)
# Both trees' compiled parts are built in place (the host's python3; .stage/pyinc.tar.xz for headers where it has
# none, as sched17's script). Then: decisions_ab.py (file mode) in both, cmp; then rounds alternating the trees (the
# order swapped every other round), each tree running align_in_flow.py (miss, hit, shifted hit; 1,200 decisions each:
# sa_align and _find_spans medians in whole decisions), align_micro.py (sa_align alone on one decision's arguments,
# 2,000 calls, miss and hit, warm and cold) and bench_connector.py (8K prompts, 600 requests, shifted: p50/p99 per
# case). The scripts are this checkout's, run from each tree's root. Every output stays under $OUT (or a temporary
# folder); rounds.txt holds the summary lines.
set -uo pipefail
[ -f .stage/fp/env.sh ] && source .stage/fp/env.sh
rounds=${1:-4}
base_tree=$(cd "${2:-/tmp/tree-base}" && pwd) || exit 1
work=$(mktemp -d)
out=${OUT:-$work/out}
mkdir -p "$out"
here=$PWD
new() { PYTHONPATH=$here:${PYTHONPATH:-} timeout 300 python3 "$@"; }
base() { (cd "$base_tree" && PYTHONPATH=$base_tree:${PYTHONPATH:-} timeout 300 python3 "$@"); }
cc_cmd=cc
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$inc/Python.h" ] && [ -f .stage/pyinc.tar.xz ]; then
  mkdir -p "$work/pyinc" && tar -xJf .stage/pyinc.tar.xz -C "$work/pyinc"
  cc_cmd="cc -I$work/pyinc/$(ls "$work/pyinc" | head -1)"
fi
for tree in base new; do
  $tree -m semblend_dynamo._native build > /dev/null 2>&1
  $tree -m semblend_dynamo._native status
  for m in trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation; do
    $tree -m $m build --cc "$cc_cmd" > /dev/null 2>&1
    $tree -m $m status
  done
done 2>&1 | tee "$out/native_status.txt"
{ uptime; nproc; lscpu | grep -E "Model name|Hypervisor vendor"; python3 -V; git log --oneline -1; } 2>&1 | tee "$out/host.txt"
for tree in base new; do $tree "$here/benchmarks/results/sched4/decisions_ab.py" 100 file > "$out/decisions_$tree.txt"; done
if cmp -s "$out/decisions_base.txt" "$out/decisions_new.txt"; then echo "decisions_ab: identical"; else
  echo "decisions_ab: DIFFERENT"; fi | tee "$out/decisions_cmp.txt"
(cd "$out" && wc -l decisions_base.txt) | tee -a "$out/decisions_cmp.txt"
for run in $(seq 1 "$rounds"); do
  order="base new"
  [ $((run % 2)) -eq 0 ] && order="new base"
  for tree in $order; do
    for case in miss hit shifted-hit; do
      f="$out/${tree}_flow_${case}_run$run.txt"
      $tree "$here/benchmarks/results/sched17/align_in_flow.py" 1200 shifted $case > "$f" 2>&1
      echo "$tree flow $case run $run: $(grep -E 'sa_align|_find_spans' "$f" | tr -s ' ' | tr '\n' ' ')"
    done
    for case in miss hit; do
      for mode in warm cold; do
        f="$out/${tree}_micro_${case}_${mode}_run$run.txt"
        $tree "$here/benchmarks/results/screen18/align_micro.py" $case 2000 $mode > "$f" 2>&1
        echo "$tree micro $case $mode run $run: $(head -1 "$f" | tr -s ' ')"
      done
    done
    f="$out/${tree}_bench_run$run.txt"
    $tree "$here/benchmarks/bench_connector.py" --prompt-tokens 8192 --requests 600 --mode shifted > "$f" 2>&1
    grep -E '^\| SemBlend' "$f" | awk -F'|' -v t="$tree" -v r="$run" '{printf "%s bench run %s:%s p50 %s p99 %s\n", t, r, $2, $5, $6}'
  done
done 2>&1 | tee "$out/rounds.txt"
