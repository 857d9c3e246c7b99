#!/usr/bin/env bash
# Device (a quiet 16-core host): bench_route_decision's children for main's code (b712f58, this branch's base) and
# this branch's, alternating, each run in its own process, raw JSON to $OUT. The device copy is the lead's checkout
# (with its .git), so both trees come from git archive, and Dynamo's Python package and the wheels from the lead's
# staged files (.stage/dynA, .stage/whl, .stage/whlA, carried). Run from that copy's root:
#   mkdir -p /tmp/r6 && git archive route6 | tar -x -C /tmp/r6 && bash /tmp/r6/benchmarks/results/route6/run_device.sh D R MS
# Args: donors, runs, the runtime stand-in's ms.
set -uo pipefail
donors=${1:-100000}; runs=${2:-1}; runtime=${3:-0.4}
if [ ! -f /tmp/semdev/.done ]; then
  mkdir -p /tmp/semdev/site /tmp/base
  tar -xJf .stage/dynA/dynamo-py.tar.xz -C /tmp/semdev/site
  xz -dc .stage/dynA/core.so.xz > /tmp/semdev/site/dynamo/_core.abi3.so
  python3 -m pip install -q --no-deps --no-index --target /tmp/semdev/site .stage/whl/*.whl .stage/whlA/*.whl 2>&1 | tail -2
  git archive b712f58 | tar -x -C /tmp/base
  touch /tmp/semdev/.done
fi
for tree in /tmp/base /tmp/r6; do
  (cd $tree && PYTHONPATH=/tmp/semdev/site:$tree python3 -m semblend_dynamo._native build >/dev/null \
    && PYTHONPATH=/tmp/semdev/site:$tree python3 -m semblend_dynamo._native status)
done
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee $OUT/host-$donors.txt
cd /tmp/r6
export PYTHONPATH=/tmp/semdev/site
for run in $(seq 1 $runs); do
  for side in before after; do
    code=/tmp/r6; [ $side = before ] && code=/tmp/base
    python3 benchmarks/bench_route_decision.py --child --code $code --donors $donors --requests 300 --runtime-ms $runtime \
      > $OUT/$side-$donors-$run.json 2> /tmp/err-$side.txt || tail -5 /tmp/err-$side.txt
    echo "$side $run: $(uptime)"
  done
done
