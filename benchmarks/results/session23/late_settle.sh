#!/usr/bin/env bash
# Session 23: two router replicas at DONORS donors (bench_replica_sync.py), this tree (the block maps settled) and
# main before it (00e19a7), one after the other on one machine.
#   bash benchmarks/results/session23/late_settle.sh DONORS INDEX [TREES] [LIMIT_S]   (output in $OUT; TREES: "this base")
# Staging: as session22/late_index.sh (.stage/fp/env.sh, .stage/pkgs, .stage/pyinc.tar.xz, .stage/dynA), and
# .stage/old/base.tar.xz (git archive 00e19a7 | xz).
set -uo pipefail
ROOT=$PWD
source .stage/fp/env.sh
python3 -m semblend_dynamo.native_entries build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} > /dev/null || echo "build native_entries failed"
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; free -g | head -2; } | tee "$OUT/host.txt"
mkdir -p /tmp/base && tar -xJf .stage/old/base.tar.xz -C /tmp/base
(cd /tmp/base && source "$ROOT/.stage/fp/env.sh" \
  && python3 -m semblend_dynamo.native_entries build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} > /dev/null) || echo "base build failed"
donors=$1 index=$2 trees=${3:-this base} limit=${4:-290}
for tree in $trees; do
  dir=$([ "$tree" = this ] && echo "$ROOT" || echo /tmp/base)
  (cd "$dir" && PYTHONPATH=$dir:/tmp/pr:/tmp/semdev/site timeout "$limit" python3 benchmarks/bench_replica_sync.py \
    --donors "$donors" --baseline-donors --index "$index" --timeout $((limit - 50)) --sync-window 8) \
    > "$OUT/late_${index}_${donors}_${tree}.txt" 2>&1
  echo "== $tree rc=$? $(uptime)"; grep -E '^(\||\{)' "$OUT/late_${index}_${donors}_${tree}.txt" | tail -6
done
