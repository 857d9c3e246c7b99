#!/usr/bin/env bash
# Device (issue 16.1, session 16, pin16): the Frontend benchmark at 100K donors with each router's event-loop thread on
# a CPU of its own (sitecustomize.py here; everything else on CPUs 2 and up) against the default scheduling, same tree,
# in turns: `bash .stage/old/mkbase.sh && bash benchmarks/results/pin16/run_device.sh [REQS] [ORDER...]`
# (default 800 requests a run, order pin free pin free). Output per run in $OUT/<i>_<variant>/.
set -uo pipefail
reqs=${1:-800}; shift || true
order=${*:-pin free pin free}
last=$(( $(nproc) - 1 ))
base_out=$OUT
i=0
for v in $order; do
  i=$((i + 1)); mkdir -p "$base_out/${i}_$v"
  if [ "$v" = pin ]; then
    OUT=$base_out/${i}_$v PIN16=1 EXTRA_PYTHONPATH=$PWD/benchmarks/results/pin16 taskset -c "2-$last" \
      bash benchmarks/results/route12/frontend_ab.sh 100000 "$reqs" this
  else
    OUT=$base_out/${i}_$v bash benchmarks/results/route12/frontend_ab.sh 100000 "$reqs" this
  fi
  grep -h "pin16:" /tmp/semblend-up-*/router-*.log 2>/dev/null | tail -2
done
