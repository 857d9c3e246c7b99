"""Text embedders: MiniLM through ONNX Runtime, and a hash fallback. Use :func:`build_embedder`."""

from .base import Embedder, EmbeddingError
from .factory import build_embedder
from .hashing import HashEmbedder
from .windows import embed_token_windows

__all__ = ["Embedder", "EmbeddingError", "HashEmbedder", "build_embedder", "embed_token_windows"]
