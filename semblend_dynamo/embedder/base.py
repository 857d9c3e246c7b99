"""The embedder contract shared by every implementation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


class EmbeddingError(ValueError):
    """Input that cannot be embedded (empty text) or output that is not a valid embedding (NaN/inf/zero).

    Discovery counts it and keeps to span evidence; a prompt with no span either is declined ``INVALID_EMBEDDING``.
    """


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to unit-norm float32 vectors; cosine similarity is the inner product."""

    @property
    def name(self) -> str:
        """Identifies model and variant: vectors from different names must never share an index."""
        ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), dim]`` float32 rows with L2 norm 1; raises :class:`EmbeddingError` on bad input/output."""
        ...


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list; :class:`EmbeddingError` for a bare string, non-strings and blank texts."""
    if isinstance(texts, str):
        raise EmbeddingError("embed() takes a sequence of texts, not a single string")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise EmbeddingError(f"text {i} is a {type(text).__name__}, not a str")
        if not text.strip():
            raise EmbeddingError(f"text {i} is empty: nothing to embed")
    return out


def normalized_rows(vectors: np.ndarray, dim: int) -> np.ndarray:
    """Validate ``vectors`` as ``[n, dim]`` finite non-zero rows and return them L2-normalised in float32."""
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise EmbeddingError(f"embedding has shape {arr.shape}, expected [n, {dim}]")
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).any(axis=1).sum())
        raise EmbeddingError(f"{bad} of {len(arr)} embeddings contain NaN or inf")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if (norms <= 1e-12).any():
        raise EmbeddingError("an embedding has zero norm")
    return np.ascontiguousarray(arr / norms, dtype=np.float32)
