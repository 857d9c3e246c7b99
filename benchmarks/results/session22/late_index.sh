#!/usr/bin/env bash
# A late replica with a usearch search index on a quiet host: when its catalog converges, and when its index has
# caught up (every resident donor in it), at each indexer batch given ("default": the module's BATCH).
#   bash benchmarks/results/session22/late_index.sh DONORS BATCH...   (output in $OUT)
# Staging: .stage/fp/env.sh (= benchmarks/results/session12/env.sh), .stage/pkgs/py312.tar.xz, .stage/pyinc.tar.xz,
# .stage/dynA/nats-server.xz.
set -uo pipefail
source .stage/fp/env.sh
python3 -m semblend_dynamo.native_entries build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} > /dev/null || echo "build native_entries failed"
python3 -m semblend_dynamo.native_entries status 2>&1 | tail -1 | tee "$OUT/native_entries_status.txt"
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; free -g | head -2; } | tee "$OUT/host.txt"
donors=$1; shift
for b in "$@"; do
  flag=$([ "$b" = default ] && echo "" || echo "--indexer-batch $b")
  timeout 560 python3 benchmarks/bench_replica_sync.py --donors $donors --baseline-donors --index usearch \
    --timeout 450 --sync-window 8 $flag > "$OUT/late_index_${donors}_${b}.txt" 2>&1
  echo "== batch $b rc=$? $(uptime)"; grep -E '^\| ' "$OUT/late_index_${donors}_${b}.txt" | tail -5
done
