#!/usr/bin/env bash
# Install semblend-dynamo with the MiniLM embedder and the ANN index, and run the embedded replay (no services needed).
# Extra arguments go to `semblend-dynamo replay` (e.g. --json, --embedder hash).
set -euo pipefail
cd "$(dirname "$0")/.."
# torch (CPU build) only for the TensorRT-LLM connector harness the replay drives; the embedder needs no torch.
WITH_TORCH=1 scripts/bootstrap.sh embedder,ann
exec .venv/bin/semblend-dynamo replay "$@"
