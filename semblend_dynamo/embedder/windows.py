"""Embedding of token windows: the bridge between the serving tokenizer's ids and a text embedder."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..segmenter import Window
from ..tokenizer import TokenizerAdapter
from .base import Embedder, EmbeddingError


def embed_token_windows(
    embedder: Embedder, tokenizer: TokenizerAdapter, token_ids: Sequence[int], windows: Sequence[Window]
) -> np.ndarray:
    """``[len(windows), dim]`` embeddings of the text of each window of ``token_ids``.

    The windows come from :class:`~semblend_dynamo.segmenter.WindowSegmenter` over the same ids. Raises
    :class:`EmbeddingError` when a window lies outside the prompt or decodes to blank text.
    """
    n = len(token_ids)
    for w in windows:
        if w.end > n:
            raise EmbeddingError(f"window [{w.start}, {w.end}) is outside a prompt of {n} tokens")
    if not windows:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    return embedder.embed([tokenizer.decode(token_ids[w.start : w.end]) for w in windows])
