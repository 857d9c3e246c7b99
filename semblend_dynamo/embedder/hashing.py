"""A cheap deterministic fallback embedder: signed feature hashing of word uni- and bigrams.

Used when ``SEMBLEND_EMBEDDER=hash`` or when the ``embedder`` extra (onnxruntime, tokenizers, the MiniLM weights)
is not installed. It captures lexical overlap only, not meaning; similarity thresholds tuned for MiniLM are
stricter than they look here.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import numpy as np
import xxhash

from .base import check_texts, normalized_rows

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_BIGRAM_WEIGHT = 0.5


class HashEmbedder:
    """Hashes lower-cased word unigrams and bigrams into ``dim`` signed buckets, then L2-normalises."""

    def __init__(self, dim: int = 384, seed: int = 0) -> None:
        if dim < 8:
            raise ValueError(f"dim must be >= 8, got {dim}")
        self._dim = dim
        self._seed = seed

    @property
    def name(self) -> str:
        return f"hash-uni-bigram-{self._dim}-s{self._seed}"

    @property
    def dim(self) -> int:
        return self._dim

    def _features(self, text: str) -> np.ndarray:
        words = _TOKEN.findall(text.lower())
        grams = [(w, 1.0) for w in words] + [(f"{a} {b}", _BIGRAM_WEIGHT) for a, b in itertools.pairwise(words)]
        vec = np.zeros(self._dim, dtype=np.float32)
        for gram, weight in grams:
            h = xxhash.xxh64_intdigest(gram.encode(), seed=self._seed)
            vec[h % self._dim] += weight if (h >> 63) else -weight
        return vec

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Called on any thread; pure function of the texts."""
        items = check_texts(texts)
        if not items:
            return np.zeros((0, self._dim), dtype=np.float32)
        return normalized_rows(np.stack([self._features(t) for t in items]), self._dim)
