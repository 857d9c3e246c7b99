#!/usr/bin/env bash
# Session 24: a late replica loads its peer's usearch index whole (snapshots on) or builds it donor by donor (off),
# one of each against the same peer, which builds its own index first (bench_replica_sync.py --peer-index).
#   bash benchmarks/results/session24/late_snapshot.sh DONORS [LIMIT_S]   (output in $OUT)
# Staging: as session23/late_settle.sh (.stage/fp/env.sh = session12/env.sh, .stage/pkgs, .stage/pyinc.tar.xz,
# .stage/dynA).
set -uo pipefail
source .stage/fp/env.sh
python3 -m semblend_dynamo.native_entries build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} > /dev/null || echo "build native_entries failed"
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; free -g | head -2; df -h /tmp | tail -1; } | tee "$OUT/host.txt"
donors=$1 limit=${2:-560}
timeout "$limit" python3 benchmarks/bench_replica_sync.py --donors "$donors" --baseline-donors --index usearch \
  --peer-index --snapshots on off --timeout $((limit - 40)) --sync-window 8 > "$OUT/late_snapshot_${donors}.txt" 2>&1
echo "== rc=$? $(uptime)"; grep -E '^(\||\{)' "$OUT/late_snapshot_${donors}.txt" | tail -8
