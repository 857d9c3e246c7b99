#!/usr/bin/env bash
# Device (issue 16.4, kern13 / session 14): bf16 in-place RoPE delta, the default against the TMA-tile (+T) and L2
# prefetch (+F) settings of SESSION14_SWEEP, on one H200 (torch 2.11, Triton 3.6), in about 4 minutes:
#   bash benchmarks/results/kern13/run_device.sh [ROUNDS]   (default 5; from the repository root; no carry)
#     1. preflight.py: every +T / +F setting checked against the torch reference at Qwen2.5-7B and Llama-3-8B 2K, each
#        in its own process (in parallel); a setting that fails to compile, faults or is wrong is left out of step 2;
#     2. bench_rope_delta.py --sweep session14: the default and the settings that passed, ROUNDS interleaved rounds
#        (the order reversed every other round), at bf16:Qwen2.5-7B:2048, bf16:Qwen2.5-7B:8192 and
#        bf16:Llama-3-8B:2048 in place; every setting checked against the reference again before it is timed;
#     3. the GPU tests of the new settings (Llama-3-8B-shaped pool, both layouts; every dtype x head_dim x style),
#        cut off after 100 s.
# Writes $OUT/{versions,preflight,gpu_tests}.txt and $OUT/session14.{txt,json}.
set -uo pipefail
rounds=${1:-5}
out=${OUT:-$PWD/out}
mkdir -p "$out"
pr=$(mktemp -d)
ln -sfn "$PWD/kernels" "$pr/semblend_kernels"  # the worktree's kernels, importable as the package
export PYTHONPATH=$pr:$PWD:${PYTHONPATH:-} TRITON_INTERPRET=0
start=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; git log --oneline -1; } \
  2>&1 | tee "$out/versions.txt"

variants=$(python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from bench_rope_delta import SESSION14_SWEEP, short_name
print(' '.join(short_name(t) for t in SESSION14_SWEEP['bf16', 'inplace'] if t.tma_tiles or t.l2_prefetch))")
baselines=$(python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from bench_rope_delta import SESSION14_SWEEP, short_name
print(','.join(short_name(t) for t in SESSION14_SWEEP['bf16', 'inplace'] if not (t.tma_tiles or t.l2_prefetch)))")
i=0
for v in $variants; do
  i=$((i + 1))
  (timeout 90 python3 benchmarks/results/kern13/preflight.py "$v" > "$out/pre_$i.txt" 2>&1
   echo "rc=$? $v" >> "$out/pre_$i.txt") &
done
wait
cat "$out"/pre_*.txt > "$out/preflight.txt" && rm -f "$out"/pre_*.txt
passed=$(grep -E '^ok ' "$out/preflight.txt" | sed -E 's/^ok ([^:]+):.*/\1/' | paste -sd, -)
echo "preflight ($((SECONDS - start)) s): passed ${passed:-none}" | tee -a "$out/preflight.txt"
grep -E '^(FAILED|WRONG)' "$out/preflight.txt"

timeout 200 python3 benchmarks/bench_rope_delta.py --rounds "$rounds" --sweep session14 \
  --cases bf16:Qwen2.5-7B:2048:inplace,bf16:Qwen2.5-7B:8192:inplace,bf16:Llama-3-8B:2048:inplace \
  --settings "$baselines${passed:+,$passed}" --out "$out/session14.json" 2>&1 | tee "$out/session14.txt"
echo "bench rc=${PIPESTATUS[0]} ($((SECONDS - start)) s)" | tee -a "$out/session14.txt"

left=$((280 - (SECONDS - start)))
[ "$left" -gt 100 ] && left=100
if [ "$left" -gt 10 ]; then
  timeout "$left" python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider \
    -k "(llama_shape and (tma or prefetch)) or one-trip-tma" 2>&1 | tail -15 > "$out/gpu_tests.txt"
  echo "gpu tests rc=${PIPESTATUS[0]} (limit ${left} s; total $((SECONDS - start)) s)" | tee -a "$out/gpu_tests.txt"
fi
