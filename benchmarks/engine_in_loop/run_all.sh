#!/usr/bin/env bash
# Engine in the loop, one command: train the small Llama, then fidelity and TTFT against cold (issue 7).
#   benchmarks/engine_in_loop/run_all.sh [RESULTS_DIR] [extra flags for run_engine_bench]
# SMOKE=1 shortens everything (20 s of training, short prompts, no 8B-shaped model) for a quick check.
# Needs torch, transformers, tokenizers, pydantic and this repository on PYTHONPATH (see docs/engine-in-the-loop.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
RESULTS="${1:-/tmp/engine-results}"
shift || true
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ "${SMOKE:-0}" == "1" ]]; then
  set -- --train-seconds 20 --max-corpus-mb 10 --prompt-tokens 256 --continuation-tokens 32 --shares 0.5,0.9 \
    --deltas 32,100 --ttft-lengths 512,1024 --share-sweep-tokens 1024 --repeats 2 --speed-shape tiny "$@"
fi
mkdir -p "$RESULTS"
"$PY" -m benchmarks.engine_in_loop.run_engine_bench --out-dir /tmp/semblend-llama --results-dir "$RESULTS" "$@" \
  2>&1 | tee "$RESULTS/log.txt"
