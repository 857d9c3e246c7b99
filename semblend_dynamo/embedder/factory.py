"""``build_embedder``: the embedder a :class:`~semblend_dynamo.config.SemblendConfig` asks for."""

from __future__ import annotations

import logging
import threading

from ..config import SemblendConfig
from .base import Embedder
from .hashing import HashEmbedder

log = logging.getLogger(__name__)
_fallback_logged = threading.Event()


def build_embedder(cfg: SemblendConfig) -> Embedder:
    """MiniLM (ONNX Runtime) for ``embedder=minilm``, or the hash fallback.

    Called once at component start-up. When the ``embedder`` extra is not installed, ``minilm`` degrades to the
    hash embedder with one clear warning per process; any other MiniLM failure (corrupt weights, bad cache dir)
    propagates so the operator sees it at start-up.
    """
    if cfg.embedder == "hash":
        return HashEmbedder()
    try:
        from .minilm import MiniLMEmbedder

        return MiniLMEmbedder.from_config(cfg)
    except ImportError as exc:
        if not _fallback_logged.is_set():
            _fallback_logged.set()
            log.warning(
                "SEMBLEND_EMBEDDER=minilm but the embedder extra is not installed (%s); using the hash fallback "
                "embedder (lexical overlap only). Install it with: pip install 'semblend-dynamo[embedder]'",
                exc,
            )
        return HashEmbedder()
