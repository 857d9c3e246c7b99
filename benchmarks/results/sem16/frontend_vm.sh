#!/usr/bin/env bash
# frontend_vm.sh BASE_TREE OUT: the Frontend benchmark (2,000 donors, 150 requests) on BASE_TREE and this checkout in
# turns (base, this, base, this), each tree's own code, outputs in OUT. Run from the repository root.
base=$1; out=$2; this=$PWD
mkdir -p "$out"
i=0
for t in "$base" "$this" "$base" "$this"; do
  i=$((i+1)); name=$([ "$t" = "$this" ] && echo this || echo main)
  uptime > "$out/frontend_${i}_$name.txt"
  (cd "$t" && PYTHONPATH=$t timeout 600 python -m benchmarks.frontend_path.run --donors 2000 --requests 150) >> "$out/frontend_${i}_$name.txt" 2>&1
  echo "rc=$? $(uptime)" >> "$out/frontend_${i}_$name.txt"
done
