#!/usr/bin/env bash
# Session 25: a late replica against a serving replica, both with a usearch index (bench_replica_sync.py --peer-index),
# one late replica per snapshot mode against the same peer, on this tree and optionally on a baseline tree made by
# applying .stage/base.patch (git diff HEAD BASE -- semblend_dynamo) to a copy of this one (the benchmark script is this
# tree's in both).
#   bash benchmarks/results/session25/late_sync.sh DONORS LIMIT_S "on off" [base]   (output in $OUT)
# Staging: .stage/fp/env.sh (= session12/env.sh), .stage/pkgs, .stage/pyinc.tar.xz, .stage/dynA, .stage/base.patch.
set -uo pipefail
source .stage/fp/env.sh
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; free -g | head -2; df -h /tmp | tail -1; } | tee "$OUT/host.txt"
donors=$1 limit=$2 modes=$3 trees=${4:-this}
for tree in $trees; do
  dir=$PWD
  if [ "$tree" = base ]; then
    dir=/tmp/base_tree && rm -rf "$dir" && mkdir -p "$dir" && cp -a . "$dir/" && (cd "$dir" && patch -s -p1 < .stage/base.patch)
  fi
  (cd "$dir" && { python3 -m semblend_dynamo.native_entries build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} > /dev/null \
     || echo "build native_entries failed"; }
   timeout "$limit" python3 benchmarks/bench_replica_sync.py --donors "$donors" --baseline-donors --index usearch \
     --peer-index --snapshots $modes --timeout $((limit - 40)) --sync-window 8) > "$OUT/late_sync_${tree}_${donors}.txt" 2>&1
  echo "== $tree rc=$? $(uptime)"; grep -E '^(\||\{)' "$OUT/late_sync_${tree}_${donors}.txt" | tail -9
done
