#!/usr/bin/env bash
# Does the connector's exact-mode decision depend on where its tree lies? bench_connector at 8K, exact, alternating:
# the baseline tree in /tmp/base, this tree where the checkout is, and a copy of this tree in /tmp/this.
#   bash benchmarks/results/session11/connector_where.sh ROUNDS   (after run_device.sh staged and built both trees)
set -uo pipefail
source .stage/fp/env.sh
bench=$PWD/benchmarks/bench_connector.py
rm -rf /tmp/base /tmp/this /tmp/pyinc && mkdir -p /tmp/base /tmp/this /tmp/pyinc && tar -xJf .stage/old/base.tar.xz -C /tmp/base
tar -xJf .stage/pyinc.tar.xz -C /tmp/pyinc
cc_cmd="cc -I/tmp/pyinc/$(ls /tmp/pyinc | head -1)"
for t in /tmp/base "$PWD"; do
  (cd "$t" && export PYTHONPATH=$t:/tmp/semdev/site && python3 -m semblend_dynamo._native build && \
    python3 -m trtllm_connector.unbox build --cc "$cc_cmd" && { [ "$t" = /tmp/base ] || { \
    python3 -m semblend_dynamo.native_planner build --cc "$cc_cmd" && \
    python3 -m trtllm_connector.native_validation build --cc "$cc_cmd"; }; }) 2>&1 | grep -c so
done
cp -a . /tmp/this/ 2>/dev/null; rm -rf /tmp/this/.stage
{ df -h . /tmp | tail -2; mount | grep -E " $(df --output=target . | tail -1) | /tmp " ; } 2>&1 | tee "$OUT/where_fs.txt"
for r in $(seq 1 "${1:-2}"); do
  for t in /tmp/base "$PWD" /tmp/this; do
    (cd "$t" && PYTHONPATH=$t:/tmp/semdev/site:/tmp/pr timeout 200 python3 "$bench" --prompt-tokens 8192 \
      --requests 2000 --mode exact) > "$OUT/where_$(basename "$t")_r$r.txt" 2>&1
    echo "$t r$r: $(grep -E 'miss|local lookup' "$OUT/where_$(basename "$t")_r$r.txt" | cut -d'|' -f2,5,6 | tr '\n' ' ')"
  done
done
