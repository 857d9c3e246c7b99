#!/usr/bin/env bash
# Device (issue 16.4, kern15 / session 15): bf16 in-place RoPE delta, the defaults against the L2 prefetch of a later
# program (+Ak, `KernelTuning.l2_prefetch_ahead`) and 4-warp one-trip programs, SESSION15_SWEEP, on one H200, in about
# 2.5-3 minutes:
#   bash benchmarks/results/kern15/run_device.sh [ROUNDS]   (default 5; from the repository root; no carry)
#     1. preflight.py: every candidate (a setting not in SESSION15_BASELINES) checked against the torch reference at
#        Qwen2.5-7B and Llama-3-8B 2K, each in its own process (in parallel, 60 s at most); a setting that fails to
#        compile, faults or is wrong is left out of step 2;
#     2. bench_rope_delta.py --sweep session15: the baselines and the candidates that passed, ROUNDS interleaved rounds
#        (the order reversed every other round), at bf16 Qwen2.5-7B and Llama-3-8B 2K and 8K in place; every setting
#        checked against the reference again before it is timed; per case the line `session15 <case>: best ...;
#        default ...; best candidate ... vs best baseline ...`, also collected in $OUT/summary.txt (150 s at most);
#     3. the +F / +A GPU tests (Llama-3-8B-shaped pool, both layouts; bf16 and fp8, head_dim 128), cut off after 30 s.
# Writes $OUT/{versions,preflight,gpu_tests,summary}.txt and $OUT/session15.{txt,json}.
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

names() {  # the sweep's candidates (1) or baselines (0), separated by $2
  python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from bench_rope_delta import SESSION15_BASELINES, SESSION15_SWEEP, short_name
print('$2'.join(short_name(t) for t in SESSION15_SWEEP['bf16', 'inplace'] if (t not in SESSION15_BASELINES) == bool($1)))"
}
variants=$(names 1 ' ')
baselines=$(names 0 ,)
i=0
for v in $variants; do
  i=$((i + 1))
  (timeout 60 python3 benchmarks/results/kern15/preflight.py "$v" > "$out/pre_$i.txt" 2>&1
   echo "rc=$? $v" >> "$out/pre_$i.txt") &
done
wait
cat "$out"/pre_*.txt > "$out/preflight.txt" && rm -f "$out"/pre_*.txt
passed=$(grep -E '^ok ' "$out/preflight.txt" | sed -E 's/^ok ([^:]+):.*/\1/' | paste -sd, -)
echo "preflight ($((SECONDS - start)) s): passed ${passed:-none}" | tee -a "$out/preflight.txt"
grep -E '^(FAILED|WRONG)' "$out/preflight.txt"

timeout 150 python3 -u benchmarks/bench_rope_delta.py --rounds "$rounds" --sweep session15 \
  --cases bf16:Qwen2.5-7B:2048:inplace,bf16:Qwen2.5-7B:8192:inplace,bf16:Llama-3-8B:2048:inplace,bf16:Llama-3-8B:8192:inplace \
  --settings "$baselines${passed:+,$passed}" --out "$out/session15.json" 2>&1 | tee "$out/session15.txt"
echo "bench rc=${PIPESTATUS[0]} ($((SECONDS - start)) s)" | tee -a "$out/session15.txt"
grep -E '^session15 ' "$out/session15.txt" | tee "$out/summary.txt"

timeout 30 python3 -m pytest -q -m gpu tests/kernels/test_rope_delta.py tests/kernels/test_kv_dtypes.py \
  -p no:cacheprovider -k "(llama_shape and prefetch) or (one-trip-prefetch and 128 and (bfloat16 or float8))" 2>&1 \
  | tail -15 > "$out/gpu_tests.txt"
echo "gpu tests rc=${PIPESTATUS[0]} (limit 30 s; total $((SECONDS - start)) s)" | tee -a "$out/gpu_tests.txt"
