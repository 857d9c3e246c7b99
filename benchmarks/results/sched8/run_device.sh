#!/usr/bin/env bash
# Device (issue 16.2, sched8): on a quiet host, a baseline tree (main before sched8) against this tree, in two calls
# of under 10 minutes each:
#   bash benchmarks/results/sched8/run_device.sh bench [ROUNDS]   (default 2 rounds)
#     1. decisions_ab.py (file mode) in both trees, then cmp: the same decisions and audit bytes;
#     2. bench_connector at 8K, exact and shifted, alternating base / this tree / this tree with its compiled planner and
#        load validation off (SEMBLEND_NATIVE_PLANNER=0 SEMBLEND_NATIVE_VALIDATION=0: what they give), ROUNDS rounds;
#        summarize_ab.py.
#   bash benchmarks/results/sched8/run_device.sh detail
#     3. lockstep_ab.py (paired, decisions alternating one by one between the two trees' processes), shifted and exact,
#        each with the trees in both positions; then this tree against itself with the compiled parts off;
#     4. decide_steps.py (per-step medians and where the p99 decisions spent their excess) in both trees, shifted hit
#        and exact hit.
# The compiled parts are built in place for the host's python3 (the span aligner in both trees; the prompt unboxing in
# both; this tree's planner and load validation modules), each build's status printed.
# Staging, in the checkout that carries this tree (.stage/fp/env.sh as in sched5/sched7; on a host whose python3 has
# numpy, torch and this project's other imports, it may be an empty file):
#   mkdir -p .stage/old && git archive <baseline commit> | xz > .stage/old/base.tar.xz
#   the C prompt unboxing needs the Python headers of the device's python3; if the host lacks them, stage a copy:
#   tar -cJf .stage/pyinc.tar.xz -C "$(dirname "$(python3.12 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')")" python3.12
#   command: bash benchmarks/results/sched8/run_device.sh bench 2 (then ... detail), carry [".stage"]
# Each call leaves one archive, $OUT/sched8_<stage>.tgz, and prints its tables.
set -uo pipefail
[ -f .stage/fp/env.sh ] && source .stage/fp/env.sh
stage=${1:-bench}
rounds=${2:-2}
out=/tmp/sched8out/$stage
rm -rf "$out" /tmp/base && mkdir -p "$out" /tmp/base && tar -xJf .stage/old/base.tar.xz -C /tmp/base
cp benchmarks/bench_connector.py /tmp/base/benchmarks/bench_connector.py
base() { (cd /tmp/base && PYTHONPATH=/tmp/base:${PYTHONPATH:-} timeout 280 python3 "$@"); }
here() { PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 280 python3 "$@"; }  # this tree first, whatever env.sh put before it
cc_cmd=cc
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$inc/Python.h" ] && [ -f .stage/pyinc.tar.xz ]; then
  rm -rf /tmp/pyinc && mkdir -p /tmp/pyinc && tar -xJf .stage/pyinc.tar.xz -C /tmp/pyinc
  cc_cmd="cc -I/tmp/pyinc/$(ls /tmp/pyinc | head -1)"
fi
for tree in base here; do
  $tree -m semblend_dynamo._native build > /dev/null 2>&1
  $tree -m semblend_dynamo._native status
  $tree -m trtllm_connector.unbox build --cc "$cc_cmd" 2>&1 | tail -1
  $tree -m trtllm_connector.unbox status
done 2>&1 | tee "$out/native_status.txt"
{
  here -m semblend_dynamo.native_planner build --cc "$cc_cmd" 2>&1 | tail -1
  here -m semblend_dynamo.native_planner status
  here -m trtllm_connector.native_validation build --cc "$cc_cmd" 2>&1 | tail -1
  here -m trtllm_connector.native_validation status
} 2>&1 | tee -a "$out/native_status.txt"
printf '#!/bin/sh\nSEMBLEND_NATIVE_PLANNER=0 SEMBLEND_NATIVE_VALIDATION=0 exec python3 "$@"\n' > /tmp/python3-nonative
chmod +x /tmp/python3-nonative
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; git log --oneline -1; } 2>&1 | tee "$out/host.txt"

if [ "$stage" = bench ]; then
  here benchmarks/results/sched4/decisions_ab.py 100 file > "$out/decisions_sched8.txt"
  base "$PWD/benchmarks/results/sched4/decisions_ab.py" 100 file > "$out/decisions_base.txt"
  if cmp -s "$out/decisions_base.txt" "$out/decisions_sched8.txt"; then echo "decisions_ab: identical"; else
    echo "decisions_ab: DIFFERENT"; fi | tee "$out/decisions_cmp.txt"
  wc -l "$out/decisions_base.txt" "$out/decisions_sched8.txt" | tee -a "$out/decisions_cmp.txt"
  rm "$out/decisions_base.txt" "$out/decisions_sched8.txt"
  for run in $(seq 1 "$rounds"); do
    for mode in exact shifted; do
      args=(benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode)
      base "${args[@]}" > "$out/base_${mode}_run$run.txt" 2>&1
      here "${args[@]}" > "$out/sched8_${mode}_run$run.txt" 2>&1
      SEMBLEND_NATIVE_PLANNER=0 SEMBLEND_NATIVE_VALIDATION=0 here "${args[@]}" > "$out/sched8-python_${mode}_run$run.txt" 2>&1
    done
  done
  python3 benchmarks/results/sched4/summarize_ab.py "$out" | tee "$out/summary.txt"
else
  for mode in shifted exact; do
    here benchmarks/results/sched3/lockstep_ab.py $mode 600 /tmp/base python3 "$PWD" python3
    here benchmarks/results/sched3/lockstep_ab.py $mode 600 "$PWD" python3 /tmp/base python3
    here benchmarks/results/sched3/lockstep_ab.py $mode 600 "$PWD" /tmp/python3-nonative "$PWD" python3
  done 2>&1 | tee "$out/lockstep.txt"
  for args in "shifted shifted-hit" "exact hit"; do
    tag=${args// /_}
    base "$PWD/benchmarks/results/sched4/decide_steps.py" 2000 $args > "$out/steps_base_$tag.txt" 2>&1
    here benchmarks/results/sched4/decide_steps.py 2000 $args > "$out/steps_sched8_$tag.txt" 2>&1
    for tree in base sched8; do echo "== $tree $args"; tail -8 "$out/steps_${tree}_$tag.txt"; done
  done 2>&1 | tee "$out/steps.txt"
fi
uptime | tee -a "$out/host.txt"
[ -f "$out/summary.txt" ] && cp "$out/summary.txt" "$OUT/summary.txt"
tar -czf "$OUT/sched8_$stage.tgz" -C "$out" .
