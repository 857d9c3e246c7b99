#!/usr/bin/env bash
# Issue 16.6 (fleet7) on a quiet host: the late replica's sync at N donors, this tree against a baseline tree, in turns.
#   bash benchmarks/results/fleet7/run_host.sh [ORDER] [N] [WINDOW]
#   ORDER: the trees in run order, comma-separated (default "base,this": one run each; e.g. "this,base" for a second
#   round: one 1M run takes ~5 min on a quiet 16-core host, so one or two runs fit a 10-minute call).
# Staging (in the checkout that carries this tree, as benchmarks/results/sched5/run_device.sh):
#   mkdir -p .stage/old && git archive <baseline commit> | xz > .stage/old/base.tar.xz ; carry [".stage"]
#   .stage/fp/env.sh puts python3 (with the project's dependencies) and nats-server on PATH.
# Each run's JSON row goes to $OUT/fleet7_rows.jsonl (and /tmp/fleet7_rows.jsonl, kept across calls on a warm host);
# the table of every row so far, with medians per tree, is printed and written to $OUT/summary.txt.
set -uo pipefail
source .stage/fp/env.sh
order=${1:-base,this}
n=${2:-1000000}
window=${3:-8}
out=${OUT:-/tmp/fleet7out}
mkdir -p "$out"
rows=/tmp/fleet7_rows.jsonl
if [ ! -d /tmp/fleet7_base ]; then
  mkdir -p /tmp/fleet7_base && tar -xJf .stage/old/base.tar.xz -C /tmp/fleet7_base
  (cd /tmp/fleet7_base && PYTHONPATH=/tmp/fleet7_base python3 -m semblend_dynamo._native build > /dev/null)
fi
python3 -m semblend_dynamo._native build > /dev/null
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; git log --oneline -1; } | tee "$out/host.txt"
for tree in ${order//,/ }; do
  if [ "$tree" = base ]; then dir=/tmp/fleet7_base; else dir=$PWD; fi
  echo "== $tree ($dir) N=$n window=$window $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$dir" && PYTHONPATH="$dir:${PYTHONPATH:-}" timeout 570 python3 benchmarks/bench_replica_sync.py --donors "$n" \
    --baseline-donors --timeout 400 --sync-window "$window") > "$out/run_${tree}_$(date +%H%M%S).txt" 2>&1
  line=$(grep -h '^{' "$out"/run_"${tree}"_*.txt | tail -1)
  [ -n "$line" ] && echo "{\"tree\": \"$tree\", \"row\": $line}" >> "$rows"
done
cp "$rows" "$out/fleet7_rows.jsonl"
python3 - "$rows" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print("| tree | donors | B blocks recovered s | B converged s | B CPU s | B RSS MiB | B RSS GB | A CPU s | pages | equal |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    x = r["row"]
    if x.get("converged_s") is None:
        print(f"| {r['tree']} | {x['donors']:,} | | not converged: {x.get('held')} donors |")
        continue
    print(f"| {r['tree']} | {x['donors']:,} | {x['blocks_s']:.1f} | {x['converged_s']:.1f} | {x['cpu_s']:.1f} "
          f"| {x['rss_mb']:,.0f} | {x['rss_mb'] * 1048576 / 1e9:.2f} | {x['peer_cpu_s']:.1f} | {x['pages']} | {x['equal']} |")
print("\nmedians:")
for tree in dict.fromkeys(r["tree"] for r in rows):
    for n in sorted({r["row"]["donors"] for r in rows if r["tree"] == tree}):
        xs = [r["row"] for r in rows if r["tree"] == tree and r["row"]["donors"] == n and r["row"].get("converged_s")]
        if not xs:
            continue
        med = {k: statistics.median(x[k] for x in xs) for k in ("converged_s", "cpu_s", "rss_mb")}
        print(f"{tree} {n:,} ({len(xs)} runs): converged {med['converged_s']:.1f} s, B CPU {med['cpu_s']:.1f} s, "
              f"B RSS {med['rss_mb']:,.0f} MiB = {med['rss_mb'] * 1048576 / 1e9:.2f} GB")
PY
