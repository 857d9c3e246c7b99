#!/usr/bin/env bash
# Device (issue 16.2, sched4): bench_connector at 8K, a baseline tree (main before sched4) against this tree, both with
# this tree's bench_connector.py, alternating, ROUNDS rounds (default 3); then decide_steps.py's per-step breakdown
# and tail attribution (which steps the decisions at the p99 spent their excess in) for an exact hit and a shifted
# hit in each tree. The native aligner is built on the device for both trees (same span_aligner.c).
# Staging, here in the checkout that carries this tree (issue16-sched-final's .stage/fp and .stage/whl: env.sh installs
# the wheels into /tmp/semdev and builds the native aligner):
#   mkdir -p .stage/old && git archive <baseline commit> | xz > .stage/old/base.tar.xz
#   command: bash benchmarks/results/sched4/run_device.sh [ROUNDS], carry [".stage"]
set -uo pipefail
source .stage/fp/env.sh
rounds=${1:-3}
rm -rf /tmp/base && mkdir -p /tmp/base/.pp && tar -xJf .stage/old/base.tar.xz -C /tmp/base
ln -sfn /tmp/base/kernels /tmp/base/.pp/semblend_kernels
cp benchmarks/bench_connector.py /tmp/base/benchmarks/bench_connector.py
mkdir -p /tmp/base/benchmarks/results/sched4 && cp benchmarks/results/sched4/decide_steps.py /tmp/base/benchmarks/results/sched4/
cp semblend_dynamo/_native/libspan_aligner.so /tmp/base/semblend_dynamo/_native/ 2>/dev/null
base() { (cd /tmp/base && PYTHONPATH=/tmp/base:/tmp/base/.pp:/tmp/semdev/site timeout 250 python3 "$@"); }
base -m semblend_dynamo._native status
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee $OUT/host.txt
for run in $(seq 1 "$rounds"); do
  for mode in exact shifted; do
    base benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode > $OUT/base_${mode}_run$run.txt 2>&1
    timeout 250 python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode \
      > $OUT/sched4_${mode}_run$run.txt 2>&1
  done
done
python3 benchmarks/results/sched4/summarize_ab.py $OUT | tee $OUT/summary.txt
for args in "exact hit" "shifted shifted-hit"; do
  echo "== base $args"; base benchmarks/results/sched4/decide_steps.py 2000 $args | tail -9
  echo "== sched4 $args"; timeout 250 python3 benchmarks/results/sched4/decide_steps.py 2000 $args | tail -9
done 2>&1 | tee $OUT/steps.txt
