#!/usr/bin/env bash
# Device (issue 16.2, sched5): on a quiet host, a baseline tree (main before sched5) against this tree.
#   1. decisions_ab.py (this tree's copy, file mode) in both trees, then cmp: the same decisions and audit bytes.
#   2. bench_connector at 8K, exact and shifted, alternating base/this tree, ROUNDS rounds (default 3), both trees
#      with this tree's bench_connector.py; summarize_ab.py over the rounds.
#   3. lockstep_ab.py (paired, decisions alternating one by one between the two trees' processes), shifted then exact.
#   4. decide_steps.py (per-step medians and the steps the decisions at the p99 spent their excess in) in both trees,
#      shifted hit and exact hit.
# The native aligner is built on the device for each tree from its own span_aligner.c (the C source changed here).
# semblend_kernels comes from this tree for both (/tmp/pr, unchanged by sched5).
# Staging, in the checkout that carries this tree (issue16-sched-final's .stage/fp and .stage/whl: env.sh installs
# the wheels into /tmp/semdev and builds this tree's native aligner):
#   mkdir -p .stage/old && git archive <baseline commit> | xz > .stage/old/base.tar.xz
#   command: bash benchmarks/results/sched5/run_device.sh [ROUNDS], carry [".stage"]
# Everything lands in /tmp/sched5out and comes back as one archive, $OUT/sched5_quiet.tgz (the device returns at most
# 8 files), plus $OUT/summary.txt; the tables are printed too.
set -uo pipefail
source .stage/fp/env.sh
rounds=${1:-3}
out=/tmp/sched5out
rm -rf "$out" /tmp/base && mkdir -p "$out" /tmp/base && tar -xJf .stage/old/base.tar.xz -C /tmp/base
cp benchmarks/bench_connector.py /tmp/base/benchmarks/bench_connector.py
base() { (cd /tmp/base && PYTHONPATH=/tmp/base:$PYTHONPATH timeout 280 python3 "$@"); }
here() { timeout 280 python3 "$@"; }
base -m semblend_dynamo._native build > /dev/null
base -m semblend_dynamo._native status
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee "$out/host.txt"

here benchmarks/results/sched4/decisions_ab.py 100 file > "$out/decisions_sched5.txt"
base "$PWD/benchmarks/results/sched4/decisions_ab.py" 100 file > "$out/decisions_base.txt"
if cmp -s "$out/decisions_base.txt" "$out/decisions_sched5.txt"; then echo "decisions_ab: identical"; else
  echo "decisions_ab: DIFFERENT"; fi | tee "$out/decisions_cmp.txt"
wc -l "$out/decisions_base.txt" "$out/decisions_sched5.txt" | tee -a "$out/decisions_cmp.txt"

for run in $(seq 1 "$rounds"); do
  for mode in exact shifted; do
    base benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode > "$out/base_${mode}_run$run.txt" 2>&1
    here benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode > "$out/sched5_${mode}_run$run.txt" 2>&1
  done
done
python3 benchmarks/results/sched4/summarize_ab.py "$out" | tee "$out/summary.txt"

for mode in shifted exact; do
  here benchmarks/results/sched3/lockstep_ab.py $mode 1000 /tmp/base python3 "$PWD" python3
done 2>&1 | tee "$out/lockstep.txt"

for args in "shifted shifted-hit" "exact hit"; do
  tag=${args// /_}
  base "$PWD/benchmarks/results/sched4/decide_steps.py" 2000 $args > "$out/steps_base_$tag.txt" 2>&1
  here benchmarks/results/sched4/decide_steps.py 2000 $args > "$out/steps_sched5_$tag.txt" 2>&1
  for tree in base sched5; do echo "== $tree $args"; tail -8 "$out/steps_${tree}_$tag.txt"; done
done 2>&1 | tee "$out/steps.txt"
uptime | tee -a "$out/host.txt"
cp "$out/summary.txt" "$OUT/summary.txt"
tar -czf "$OUT/sched5_quiet.tgz" -C "$out" .
