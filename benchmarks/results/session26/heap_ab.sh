#!/usr/bin/env bash
# Session 26: the serving and the late replica with their heap bounded (--heap-top-mib 4, the router's default) and
# with glibc's adaptive thresholds (0, as before), both with a usearch index, side by side on one host: each variant
# pinned to its own half of the cores (a NUMA node each where there are two); one variant alone has every core.
#   bash benchmarks/results/session26/heap_ab.sh DONORS LIMIT_S "on off" "4 0"   (output in $OUT)
# Staging: .stage/fp/env.sh (= session12/env.sh), .stage/pkgs, .stage/pyinc.tar.xz, .stage/dynA.
set -uo pipefail
source .stage/fp/env.sh
{ uptime; nproc; lscpu | grep -iE "model name|numa"; python3 -V; free -g | head -2; } | tee "$OUT/host.txt"
python3 -m semblend_dynamo.native_entries build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} > /dev/null || echo "build native_entries failed"
donors=$1 limit=$2 modes=$3 tops=${4:-"4 0"}
n=$(nproc) half=$(( $(nproc) / 2 ))
if [ -r /sys/devices/system/node/node1/cpulist ]; then
  sets=("$(cat /sys/devices/system/node/node0/cpulist)" "$(cat /sys/devices/system/node/node1/cpulist)")
else
  sets=("0-$((half - 1))" "$half-$((n - 1))")
fi
[ "$(echo $tops | wc -w)" = 1 ] && sets=("0-$((n - 1))")
i=0
for top in $tops; do
  taskset -c "${sets[$i]}" timeout "$limit" python3 benchmarks/bench_replica_sync.py --donors "$donors" \
    --baseline-donors --index usearch --peer-index --snapshots $modes --timeout $((limit - 40)) --sync-window 8 \
    --heap-top-mib "$top" > "$OUT/heap_top_${top}_${donors}.txt" 2>&1 &
  echo "heap top $top on cpus ${sets[$i]}" | tee -a "$OUT/host.txt"
  i=$((i + 1))
done
wait
for top in $tops; do echo "== heap top $top"; grep -E '^(\||\{)' "$OUT/heap_top_${top}_${donors}.txt" | tail -9; done
uptime
