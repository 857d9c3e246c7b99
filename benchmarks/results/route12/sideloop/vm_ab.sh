#!/usr/bin/env bash
# vm_ab.sh OUT N: the Frontend benchmark (20K donors, 150 requests) without and with the side-loop experiment
# (sitecustomize.py here, ROUTE12_SIDELOOP=1) in turns: plain side side plain; tables in OUT/frontend_<n>_<which>.txt
# (n counts from N). Run from the repo root.
out=$1; n=$2
mkdir -p "$out"
for t in plain side side plain; do
  if [ $t = side ]; then export ROUTE12_SIDELOOP=1; else export ROUTE12_SIDELOOP=0; fi
  PYTHONPATH=$PWD:$PWD/benchmarks/results/route12/sideloop timeout 900 python -m benchmarks.frontend_path.run \
    --donors 20000 --requests 150 > "$out/frontend_${n}_$t.txt" 2>&1
  echo "== $t $(uptime)"; grep -E "total_added|exact\`|spans\`|ask_loads|decide\`|placed" "$out/frontend_${n}_$t.txt"
  n=$((n + 1))
done
