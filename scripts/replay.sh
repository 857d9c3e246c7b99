#!/usr/bin/env bash
# Install semblend-dynamo with the MiniLM embedder and run the embedded replay (no services needed).
# Extra arguments go to `semblend-dynamo replay` (e.g. --json, --embedder hash).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh embedder
exec .venv/bin/semblend-dynamo replay "$@"
