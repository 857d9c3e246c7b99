#!/usr/bin/env bash
# Device (issue 16.1, session 16, thp16): whether the host's kernel backs the span search's tables with huge pages,
# then the Frontend A/B at 100K donors (route12's script) for the given order of trees, 800 requests a run:
#   bash .stage/old/mkbase.sh && bash benchmarks/results/thp16/run_device.sh this base this base
# While each run is in its timed phase, the semantic router's AnonHugePages (smaps_rollup) are sampled into
# $OUT/thp_router.txt. Stops before the Frontend runs when a 16 MiB table gets no huge page.
set -uo pipefail
source .stage/fp/env.sh
{ echo "enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"; echo "defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"
  python3 - <<'PY'
from semblend_dynamo import hugepages
a = hugepages.zeros((16 << 20,), "uint8"); a[::4096] = 1
print("16 MiB table:", [l.strip() for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages")][0])
PY
} 2>&1 | tee "$OUT/thp_check.txt"
grep -q "AnonHugePages: *0 kB" "$OUT/thp_check.txt" && { echo "no huge pages granted: Frontend runs skipped"; exit 0; }
( while sleep 20; do
    for p in $(pgrep -f seeded_router); do
      echo "$(date +%T) pid $p $(grep -E '^(Rss|AnonHugePages)' /proc/$p/smaps_rollup 2>/dev/null | tr -s ' ' | tr '\n' ' ')"
    done
  done ) > "$OUT/thp_router.txt" 2>&1 &
sampler=$!
bash benchmarks/results/route12/frontend_ab.sh 100000 "${REQS:-800}" "$@"
kill $sampler
tail -4 "$OUT/thp_router.txt"
