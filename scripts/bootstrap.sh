#!/usr/bin/env bash
# Create .venv and install semblend-dynamo with the extras named in $1 (default: dev).
# Installs torch's CPU build first so no extra drags in the multi-GB CUDA wheels, and makes sure a
# nats-server binary exists (the tests start their own server on a free loopback port).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-dev}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${VPIP[@]}" install --upgrade pip >/dev/null
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  # CPU build (a file of it ships with this machine kind); falls back to the CPU index.
  "${VPIP[@]}" install torch==2.13.0 2>/dev/null \
    || "${VPIP[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
fi
"${VPIP[@]}" install -e ".[${EXTRAS}]"
if [ "$EXTRAS" = "dev" ] || [ "$EXTRAS" = "bench" ]; then
  if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
    echo "installing nats-server (apt-get)" >&2
    (apt-get install -y -q nats-server >/dev/null 2>&1) || (apt-get update -q >/dev/null && apt-get install -y -q nats-server >/dev/null)
  fi
fi
