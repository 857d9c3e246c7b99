#!/usr/bin/env bash
# Late-replica sync on a quiet host, a baseline tree against this tree, one after the other in the given order.
#   bash benchmarks/results/session11/fleet_ab.sh DONORS ORDER...   (ORDER: base | this; output in $OUT)
# Staging: .stage/fp/env.sh (wheels, nats-server), .stage/old/base.tar.xz (`git archive <baseline> | xz`).
set -uo pipefail
source .stage/fp/env.sh
donors=$1; shift
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xJf .stage/old/base.tar.xz -C /tmp/base
(cd /tmp/base && PYTHONPATH=/tmp/semdev/site:/tmp/base python3 -m semblend_dynamo._native build >/dev/null 2>&1)
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; free -g | head -2; } | tee -a "$OUT/fleet_host.txt"
for t in "$@"; do
  root=$([ "$t" = base ] && echo /tmp/base || echo "$PWD")
  (cd "$root" && PYTHONPATH=/tmp/semdev/site:$root timeout 290 python3 benchmarks/bench_replica_sync.py \
    --donors $donors --baseline-donors --timeout 250 --sync-window 8) > "$OUT/fleet_${t}_${donors// /_}.txt" 2>&1
  echo "== $t rc=$? $(uptime)"; grep -E '^\| (sync|v2) ' "$OUT/fleet_${t}_${donors// /_}.txt" | tail -6
done
