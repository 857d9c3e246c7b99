#!/usr/bin/env bash
# frontend_ab.sh DONORS REQS ORDER...: route10's script (same runs, same staging) with route12's probe and, after
# route10's probe report, route12's timeline report. The Frontend benchmark for each named tree in the given order (e.g. base this
# this base), output in $OUT. A name is `this` (the checkout), `base` (.stage/old/base.tar.xz) or NAME
# (.stage/trees/NAME.tar.xz, a `git archive`). Every tree gets both compiled modules (the span aligner's library and
# the planner's extension) built for this Python (session 11's script built only the aligner for the other trees),
# and runs this checkout's benchmarks/frontend_path/run.py. With PROBE=1 the semantic router of every run also carries
# the span-path probe (benchmarks/results/route12/probe, this checkout's) and its report is printed after the run.
# A name ending in +side (e.g. this+side) runs that tree with route12's side-loop experiment
# (benchmarks/results/route12/sideloop, ROUTE12_SIDELOOP=1; no probe in that run: both are a sitecustomize).
# FRONTEND_ARGS: more arguments for every run (e.g. --span-search-thread off); EXTRA_PYTHONPATH: appended to every
# run's PYTHONPATH (e.g. a sitecustomize of an experiment).
# .stage/fp/env.sh: session 12's device staging (a copy of benchmarks/results/session12/env.sh).
set -uo pipefail
source .stage/fp/env.sh
donors=$1; reqs=$2; shift 2
here=$PWD
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee -a "$OUT/host.txt"
i=0
for label in "$@"; do
  i=$((i + 1)); root=$PWD; t=${label%+side}; side=$([ "$t" != "$label" ] && echo 1 || echo 0)
  if [ "$t" != this ]; then
    tarball=$([ "$t" = base ] && echo .stage/old/base.tar.xz || echo ".stage/trees/$t.tar.xz")
    root=/tmp/tree-$t
    if [ ! -d "$root" ]; then
      mkdir -p "$root" && tar -xJf "$tarball" -C "$root"
      cp benchmarks/frontend_path/run.py "$root/benchmarks/frontend_path/run.py"
    fi
  fi
  path=/tmp/semdev/site:/tmp/pr:$root${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
  (cd "$root" && PYTHONPATH=$path python3 -m semblend_dynamo._native build >/dev/null 2>&1) || echo "== $t: aligner build failed"
  (cd "$root" && PYTHONPATH=$path python3 -m semblend_dynamo.native_planner build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} \
    >/dev/null 2>&1) || echo "== $t: planner build failed"
  for module in semblend_dynamo._native semblend_dynamo.native_planner; do
    (cd "$root" && PYTHONPATH=$path python3 -m "$module" status)
  done
  probe=(env ROUTE12_SIDELOOP=$side)
  if [ "$side" = 1 ]; then  # the side-loop experiment (its own sitecustomize: no probe in this run)
    path=$path:$here/benchmarks/results/route12/sideloop
  elif [ "${PROBE:-0}" = 1 ]; then
    mkdir -p "$OUT/probe_${i}_$t"
    probe+=("ROUTE10_PROBE=$OUT/probe_${i}_$t")
    path=$path:$here/benchmarks/results/route12/probe
  fi
  (cd "$root" && PYTHONPATH=$path timeout 280 "${probe[@]}" python3 -m benchmarks.frontend_path.run \
    --donors "$donors" --requests "$reqs" ${FRONTEND_ARGS:-}) > "$OUT/frontend_${i}_${label/+/-}.txt" 2>&1
  echo "== $label rc=$? $(uptime)"; grep -E "total_added|decide|spans\`|exact\`|semantic\`|hint\`|over 5 ms" "$OUT/frontend_${i}_${label/+/-}.txt"
  if [ "${PROBE:-0}" = 1 ] && [ "$side" = 0 ]; then
    for f in "$OUT/probe_${i}_$t"/probe_*.jsonl; do
      [ -e "$f" ] || { echo "== $t: no probe lines (sitecustomize not loaded?)"; continue; }
      { PYTHONPATH=/tmp/semdev/site:/tmp/pr python3 benchmarks/results/route10/span_probe_report.py "$f" --count "$reqs"
        echo; PYTHONPATH=/tmp/semdev/site:/tmp/pr python3 benchmarks/results/route12/timeline_report.py "$f" \
          --count "$reqs"; } | tee "$OUT/probe_${i}_$t.md"
      gzip -f "$f"
    done
  fi
done
