#!/usr/bin/env bash
# Session 29 device call (from the repository root, carrying .stage/fp, .stage/pkgs, .stage/pyinc.tar.xz and
# .stage/base, a copy of session 28's kernels/, and .stage/varB): `run_device.sh ab|copyvar|copy2k|abtests|tests`.
#   ab:    ab_defaults.py 5 (both trees' defaults at every benchmarked case: same bytes, times), then the standing
#          measure (bench_rope_delta.py --cases bf16:Qwen2.5-7B:2048:inplace,bf16:Llama-3-8B:2048:inplace --rounds 5);
#   copyvar: ab_copy_variants.py 7 (the copy grid kernel's start three ways), then the GPU kernel tests;
#   copy2k: copy2k_sweep.py 5 (bf16 copy at 2K, every SIZE_SWEEP setting);
#   abtests: ab_defaults.py 5, then the GPU kernel tests;
#   tests: the GPU kernel tests (pytest -m gpu tests/kernels).
set -uo pipefail
out=${OUT:-$PWD/out}
mkdir -p "$out"
source .stage/fp/env.sh
export TRITON_INTERPRET=0
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } 2>&1 | tee "$out/versions.txt"
case ${1:-ab} in
  ab)
    python3 benchmarks/results/session29/ab_defaults.py 5 2>&1 | tee "$out/ab_defaults.txt"
    python3 benchmarks/bench_rope_delta.py --cases bf16:Qwen2.5-7B:2048:inplace,bf16:Llama-3-8B:2048:inplace \
      --rounds 5 > "$out/rope_short.txt" 2>&1
    grep -E "^\| |^## " "$out/rope_short.txt" | tail -30 ;;
  copyvar)
    python3 benchmarks/results/session29/ab_copy_variants.py 7 2>&1 | tee "$out/ab_copy_variants.txt"
    timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 | tail -40 > "$out/gpu_tests.txt"; tail -5 "$out/gpu_tests.txt" ;;
  copy2k)
    python3 benchmarks/results/session29/copy2k_sweep.py 5 2>&1 | tee "$out/copy2k_sweep.txt" ;;
  abtests)
    python3 benchmarks/results/session29/ab_defaults.py 5 2>&1 | tee "$out/ab_defaults.txt"
    timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 | tail -40 > "$out/gpu_tests.txt"; tail -3 "$out/gpu_tests.txt" ;;
  tests)
    timeout 500 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 | tail -40 | tee "$out/gpu_tests.txt" ;;
esac
