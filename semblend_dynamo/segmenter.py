"""Segmentation of long prompts into overlapping token windows for embedding.

A window is a half-open token range ``[start, end)``. Windows have ``window_tokens`` tokens, consecutive ones share
``overlap`` tokens, and together they cover the whole prompt; the last window is shifted back so that it ends
exactly at the prompt's end (and is full-sized whenever the prompt is long enough). The routing path embeds only a
bounded, deterministic :meth:`WindowSegmenter.sample` of them (``SEMBLEND_MAX_EMBED_WINDOWS``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Window(BaseModel):
    """Token range ``[start, end)`` of one window."""

    model_config = ConfigDict(frozen=True)

    start: int = Field(ge=0)
    end: int = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end <= self.start:
            raise ValueError(f"window end ({self.end}) must be after start ({self.start})")
        return self

    def __len__(self) -> int:
        return self.end - self.start


class WindowSegmenter:
    """Cuts ``n_tokens`` into overlapping windows; stateless and cheap (no tokens are copied)."""

    def __init__(self, window_tokens: int, overlap: int) -> None:
        if window_tokens < 1:
            raise ValueError(f"window_tokens must be >= 1, got {window_tokens}")
        if not 0 <= overlap < window_tokens:
            raise ValueError(f"overlap must be in [0, window_tokens={window_tokens}), got {overlap}")
        self.window_tokens = window_tokens
        self.overlap = overlap
        self.stride = window_tokens - overlap

    def windows(self, n_tokens: int) -> list[Window]:
        """Windows covering ``[0, n_tokens)`` in order; [] for an empty prompt."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if n_tokens == 0:
            return []
        if n_tokens <= self.window_tokens:
            return [Window(start=0, end=n_tokens)]
        out = []
        start = 0
        while start + self.window_tokens < n_tokens:
            out.append(Window(start=start, end=start + self.window_tokens))
            start += self.stride
        # The tail window ends at n_tokens; it overlaps its predecessor by at least `overlap` tokens.
        out.append(Window(start=n_tokens - self.window_tokens, end=n_tokens))
        return out

    @staticmethod
    def sample(windows: Sequence[Window], max_n: int) -> list[Window]:
        """At most ``max_n`` windows, evenly spread, always the first and the last; same input -> same output."""
        if max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {max_n}")
        n = len(windows)
        if n <= max_n:
            return list(windows)
        if max_n == 1:
            return [windows[0]]
        picks = sorted({round(i * (n - 1) / (max_n - 1)) for i in range(max_n)})
        return [windows[i] for i in picks]
