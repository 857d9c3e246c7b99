#!/usr/bin/env bash
# What ran on the device (a quiet 16-core host) for route6's in-process numbers (device-quiet-host/).
#
# The device copy is the lead's checkout (main at b712f58, this branch's base; its .git holds main only), so this
# branch's code went over as its diff: `git diff -U1 b712f58 7d808b8 -- semblend_dynamo
# benchmarks/bench_route_decision.py | xz -9e | base64 -w0`, appended to /tmp/p.b64 in four command-line chunks
# (md5 checked). Carried: the lead's staged .stage/dynA/{core.so.xz,dynamo-py.tar.xz}, .stage/whlA and five of
# .stage/whl's wheels (annotated_types, nats_py, pydantic, pydantic_core, typing_inspection; usearch and numkong left
# out for size, so the donor index is numpy, which the span path does not use). Then, from the copy's root:
#   bash run_device.sh RUNTIME_MS RUNS...   e.g.  bash run_device.sh 0.15 100000-1 100000-2 20000-1
set -uo pipefail
runtime=$1; shift
S=/tmp/s
mkdir -p $S /tmp/b /tmp/r && git archive HEAD | tar -x -C /tmp/b && cp -r /tmp/b/. /tmp/r \
  && base64 -d /tmp/p.b64 | xz -d > /tmp/p.diff && (cd /tmp/r && git apply /tmp/p.diff) || { echo PATCHFAIL; exit 1; }
tar -xJf .stage/dynA/dynamo-py.tar.xz -C $S
xz -dc .stage/dynA/core.so.xz > $S/dynamo/_core.abi3.so
python3 -m pip install -q --no-deps --no-index --target $S .stage/whl/*.whl .stage/whlA/*.whl 2>&1 | tail -1
for t in /tmp/b /tmp/r; do (cd $t; PYTHONPATH=$S:$t python3 -m semblend_dynamo._native build > /dev/null); done
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee $OUT/host.txt
cd /tmp/r
export PYTHONPATH=$S
for r in "$@"; do
  d=${r%-*}
  for s in before after; do
    c=/tmp/r; [ $s = before ] && c=/tmp/b
    timeout 250 python3 benchmarks/bench_route_decision.py --child --code $c --donors $d --requests 300 \
      --runtime-ms $runtime > $OUT/$s-$r.json 2> /tmp/e
    echo "$s $r $(date +%T) $(uptime)"
  done
done
