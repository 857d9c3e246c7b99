#!/usr/bin/env bash
# Session 27: a late replica against a serving replica, both with a usearch index, on this tree and on a baseline tree
# (.stage/base.patch applied to a copy of this one: `git diff HEAD BASE -- semblend_dynamo`; the benchmark script is
# this tree's in both), side by side on one host, each pinned to its own half of the cores (a NUMA node each where
# there are two); one tree alone has every core.
#   bash benchmarks/results/session27/late_ab.sh DONORS LIMIT_S "on off" "this base"   (output in $OUT)
# Staging: .stage/fp/env.sh (= session12/env.sh), .stage/pkgs, .stage/pyinc.tar.xz, .stage/dynA, .stage/base.patch.
set -uo pipefail
source .stage/fp/env.sh
{ uptime; nproc; lscpu | grep -iE "model name|numa"; python3 -V; free -g | head -2; } | tee "$OUT/host.txt"
donors=$1 limit=$2 modes=$3 trees=${4:-"this base"}
n=$(nproc) half=$(( $(nproc) / 2 ))
if [ -r /sys/devices/system/node/node1/cpulist ]; then
  sets=("$(cat /sys/devices/system/node/node0/cpulist)" "$(cat /sys/devices/system/node/node1/cpulist)")
else
  sets=("0-$((half - 1))" "$half-$((n - 1))")
fi
[ "$(echo $trees | wc -w)" = 1 ] && sets=("0-$((n - 1))")
i=0
for tree in $trees; do
  dir=$PWD
  if [ "$tree" = base ]; then
    dir=/tmp/base_tree && rm -rf "$dir" && mkdir -p "$dir" && cp -a . "$dir/" && (cd "$dir" && patch -s -p1 < .stage/base.patch)
  fi
  (cd "$dir" && export PYTHONPATH="$dir:${PYTHONPATH#*:}" && for m in semblend_dynamo._native semblend_dynamo.native_planner semblend_dynamo.native_entries; do
     if [ -n "${SEMBLEND_CC:-}" ] && [ "$m" != semblend_dynamo._native ]; then python3 -m $m build --cc "$SEMBLEND_CC" > /dev/null 2>&1
     else python3 -m $m build > /dev/null 2>&1; fi || echo "build $m failed ($tree)"; done
   python3 -m semblend_dynamo._native status | head -1
   taskset -c "${sets[$i]}" timeout "$limit" python3 benchmarks/bench_replica_sync.py --donors "$donors" \
     --baseline-donors --index usearch --peer-index --snapshots $modes --timeout $((limit - 40)) --sync-window 8 \
     > "$OUT/late_${tree}_${donors}.txt" 2>&1) &
  echo "$tree on cpus ${sets[$i]}" | tee -a "$OUT/host.txt"
  i=$((i + 1))
done
wait
for tree in $trees; do echo "== $tree"; grep -E '^(\||\{)' "$OUT/late_${tree}_${donors}.txt" | tail -9; done
uptime
