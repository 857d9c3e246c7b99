#!/usr/bin/env bash
# Device (issue 16.2, sched13): on a quiet host, the baseline tree (main, or sched12's tip) against this tree, in one
# call of ~4 minutes:
#   bash benchmarks/results/sched13/run_device.sh [ROUNDS]   (default 3)
#     1. decisions_ab.py (file mode) in both trees, then cmp: the same decisions and audit bytes;
#     2. bench_connector at 8K in shifted mode, alternating base / this tree (the order swapped every other round),
#        ROUNDS rounds, then one round of exact mode; summarize_ab.py;
#     3. align_parts.py (sched10's) in both trees, a miss and a shifted hit (1,000 searches each): the span search alone,
#        the compiled call and the Python around it (the two-bit filter changes only the compiled call's probes).
# Every compiled part is built in place for the host's python3 in both trees (each build's status printed).
# Staging (as sched10's run_device.sh): .stage/old/base.tar.xz = `git archive main | xz`, .stage/pyinc.tar.xz if the
# host's python3 has no headers, .stage/fp/env.sh optional; carry [".stage"].
# Leaves $OUT/sched13.tgz (every output file) and $OUT/summary.txt, and prints the tables.
set -uo pipefail
[ -f .stage/fp/env.sh ] && source .stage/fp/env.sh
rounds=${1:-3}
work=$(mktemp -d)
out=$work/out
base_tree=$work/base
mkdir -p "$out" "$base_tree" && tar -xJf .stage/old/base.tar.xz -C "$base_tree"
cp benchmarks/bench_connector.py "$base_tree/benchmarks/bench_connector.py"  # the same benchmark on both sides
base() { (cd "$base_tree" && PYTHONPATH=$base_tree:${PYTHONPATH:-} timeout 200 python3 "$@"); }
here() { PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 200 python3 "$@"; }
cc_cmd=cc
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$inc/Python.h" ] && [ -f .stage/pyinc.tar.xz ]; then
  mkdir -p "$work/pyinc" && tar -xJf .stage/pyinc.tar.xz -C "$work/pyinc"
  cc_cmd="cc -I$work/pyinc/$(ls "$work/pyinc" | head -1)"
fi
for tree in base here; do
  $tree -m semblend_dynamo._native build > /dev/null 2>&1
  $tree -m semblend_dynamo._native status
  for m in trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation; do
    $tree -m $m build --cc "$cc_cmd" > /dev/null 2>&1
    $tree -m $m status
  done
done 2>&1 | tee "$out/native_status.txt"
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; git log --oneline -1; } 2>&1 | tee "$out/host.txt"

here benchmarks/results/sched4/decisions_ab.py 100 file > "$out/decisions_sched13.txt"
base "$PWD/benchmarks/results/sched4/decisions_ab.py" 100 file > "$out/decisions_base.txt"
if cmp -s "$out/decisions_base.txt" "$out/decisions_sched13.txt"; then echo "decisions_ab: identical"; else
  echo "decisions_ab: DIFFERENT"; fi | tee "$out/decisions_cmp.txt"
(cd "$out" && wc -l decisions_base.txt decisions_sched13.txt) | tee -a "$out/decisions_cmp.txt"
rm "$out/decisions_base.txt" "$out/decisions_sched13.txt"

bench() {  # tree mode run
  local name=$([ "$1" = here ] && echo sched13 || echo base)
  $1 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode "$2" > "$out/${name}_$2_run$3.txt" 2>&1
  echo "$name $2 run $3: $(grep -E 'SemBlend' "$out/${name}_$2_run$3.txt" | cut -d'|' -f2,5,6 | tr '\n' ' ')"
}
for run in $(seq 1 "$rounds"); do
  order="base here"
  [ $((run % 2)) -eq 0 ] && order="here base"
  for tree in $order; do bench $tree shifted "$run"; done
done 2>&1 | tee "$out/rounds.txt"
for tree in here base; do bench $tree exact 1; done 2>&1 | tee -a "$out/rounds.txt"
python3 benchmarks/results/sched4/summarize_ab.py "$out" | tee "$out/summary.txt"

for case in miss shifted-hit; do
  base "$PWD/benchmarks/results/sched10/align_parts.py" 1000 $case base
  here benchmarks/results/sched10/align_parts.py 1000 $case sched13
done 2>&1 | tee "$out/align_parts.txt"
uptime | tee -a "$out/host.txt"
cp "$out/summary.txt" "$OUT/summary.txt"
tar -czf "$OUT/sched13.tgz" -C "$out" .
rm -rf "$work"
