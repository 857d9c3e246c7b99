"""The Frontend-path benchmark's donors and requests, generated the same way in the router and the client."""

from __future__ import annotations

import numpy as np

BLOCK = 32
DONOR_TOKENS = 512
TARGET_TOKENS = 8192
DONOR_VOCAB = (100, 5000)
FILLER_VOCAB = (5000, 7300)
"""Token ranges inside the bundled tokenizer's vocabulary (7,348 tokens): donors and fillers never share a token."""
SEED = 7


def donor_tokens(n: int, seed: int = SEED) -> np.ndarray:
    """``n`` donor prompts of ``DONOR_TOKENS`` random tokens, one row each."""
    return np.random.default_rng(seed).integers(*DONOR_VOCAB, size=(n, DONOR_TOKENS), dtype=np.int32)


def span_request(donors: np.ndarray, rng: np.random.Generator) -> list[int]:
    """8 random donors in reverse order behind 2,048 filler tokens, then more filler: no exact prefix, 8 spans."""
    picks = rng.choice(len(donors), size=8, replace=False)
    filler = rng.integers(*FILLER_VOCAB, size=TARGET_TOKENS - 8 * DONOR_TOKENS).tolist()
    return filler[:2048] + [t for i in picks[::-1] for t in donors[i].tolist()] + filler[2048:]


def unrelated_request(rng: np.random.Generator) -> list[int]:
    """A prompt sharing no span with any donor: the router needs its embedding."""
    return rng.integers(*FILLER_VOCAB, size=TARGET_TOKENS).tolist()
