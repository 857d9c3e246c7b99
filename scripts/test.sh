#!/usr/bin/env bash
# Install everything the tests need and run the whole suite: ruff (lint + format), mypy, pytest.
# Tests that need NATS start their own nats-server on a free 127.0.0.1 port.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh dev
export PATH="$PWD/.venv/bin:$PATH:/usr/sbin"
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"
echo "== ruff"; ruff check . ; ruff format --check .
echo "== mypy"; mypy
echo "== pytest"; pytest -q -ra "$@"
