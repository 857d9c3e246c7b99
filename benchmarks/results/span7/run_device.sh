#!/usr/bin/env bash
# Quiet host (issues 16.1 / 16.2, span7): the span aligner in one compiled call against a baseline tree (main before
# span7), on the host CPU of a device machine.
#   1. align_ab.py: SpanAligner.align of both trees in one process, calls interleaved, 20K and 100K donors, int64 and
#      uint32, shifted hit / shared hit / miss; then 100K int64 with 8 MB written between calls (caches as a request
#      finds them through the Frontend).
#   2. bench_connector at 8K tokens, shifted mode, alternating base / this tree, ROUNDS rounds (default 3), both trees
#      with this tree's bench_connector.py; summarize_ab.py over the rounds.
#   3. lockstep_ab.py shifted (both trees' schedulers in two processes, decisions alternating one by one).
#   4. decide_steps.py shifted shifted-hit in both trees (the span search's share of a decision).
# The native aligner is built for each tree from its own span_aligner.c.
# Staging, in the checkout that carries this tree (as for sched5: .stage/fp/env.sh puts a Python with numpy and this
# tree's dependencies on PATH and this tree on PYTHONPATH):
#   mkdir -p .stage/old && git archive <baseline commit> | xz > .stage/old/base.tar.xz
#   commands (two calls: each stays under the 10-minute limit), carry [".stage"]:
#     bash benchmarks/results/span7/run_device.sh align        (1.)
#     bash benchmarks/results/span7/run_device.sh connector 3  (2.-4., 3 rounds)
# Everything lands in /tmp/span7out/PART and comes back as one archive, $OUT/span7_quiet_PART.tgz, plus
# $OUT/summary_PART.txt; the tables are printed too.
set -uo pipefail
source .stage/fp/env.sh
part=${1:-align}
rounds=${2:-3}
out=/tmp/span7out/$part
rm -rf "$out" /tmp/base && mkdir -p "$out" /tmp/base && tar -xJf .stage/old/base.tar.xz -C /tmp/base
cp benchmarks/bench_connector.py /tmp/base/benchmarks/bench_connector.py
base() { (cd /tmp/base && PYTHONPATH=/tmp/base:$PYTHONPATH timeout 400 python3 "$@"); }
here() { timeout 400 python3 "$@"; }
base -m semblend_dynamo._native build > /dev/null
base -m semblend_dynamo._native status
here -m semblend_dynamo._native build > /dev/null
here -m semblend_dynamo._native status
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee "$out/host.txt"

if [ "$part" = align ]; then
  here=$PWD
  (cd benchmarks/results/span7 && timeout 360 python3 align_ab.py /tmp/base "$here" --donors 20000,100000 \
    --calls 600) 2>&1 | tee "$out/align_ab_evict0.txt"
  (cd benchmarks/results/span7 && timeout 200 python3 align_ab.py /tmp/base "$here" --donors 100000 --widths int64 \
    --calls 600 --evict-mb 8) 2>&1 | tee "$out/align_ab_evict8.txt"
  uptime | tee -a "$out/host.txt"
  cat "$out"/align_ab_evict*.txt > "$OUT/summary_align.txt"
  tar -czf "$OUT/span7_quiet_align.tgz" -C "$out" .
  exit 0
fi

for run in $(seq 1 "$rounds"); do
  base benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted > "$out/base_shifted_run$run.txt" 2>&1
  here benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted > "$out/span7_shifted_run$run.txt" 2>&1
done
python3 benchmarks/results/sched4/summarize_ab.py "$out" | tee "$out/summary.txt"

here benchmarks/results/sched3/lockstep_ab.py shifted 1000 /tmp/base python3 "$PWD" python3 2>&1 | tee "$out/lockstep.txt"

base "$PWD/benchmarks/results/sched4/decide_steps.py" 2000 shifted shifted-hit > "$out/steps_base.txt" 2>&1
here benchmarks/results/sched4/decide_steps.py 2000 shifted shifted-hit > "$out/steps_span7.txt" 2>&1
for tree in base span7; do echo "== $tree"; tail -8 "$out/steps_$tree.txt"; done 2>&1 | tee "$out/steps.txt"
uptime | tee -a "$out/host.txt"
cp "$out/summary.txt" "$OUT/summary_connector.txt"
tar -czf "$OUT/span7_quiet_connector.tgz" -C "$out" .
