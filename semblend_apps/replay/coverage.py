"""How much of a prompt resident donors could cover at most: the ``donor_covered_tokens`` of the replay report.

A prompt token is covered when some window of ``span_tokens`` consecutive prompt tokens around it occurs, token for
token, in a donor resident in the same namespace. Windows are compared as their exact token bytes (set membership
hashes and then compares them), so no hash collision can count. This is the ceiling that span alignment, the
planner's gates and the connector's checks then cut down to what is materialized; it ignores block alignment.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["DonorCoverage"]


class DonorCoverage:
    """Every ``span_tokens``-token window of the resident donors, per namespace (replay has one worker)."""

    def __init__(self, span_tokens: int) -> None:
        if span_tokens < 1:
            raise ValueError(f"span_tokens must be >= 1, got {span_tokens}")
        self.span_tokens = span_tokens
        self._windows: dict[str, set[bytes]] = {}

    def _rows(self, tokens: Sequence[int]) -> list[bytes]:
        arr = np.ascontiguousarray(np.asarray(tokens, dtype=np.uint32))
        if arr.size < self.span_tokens:
            return []
        view = sliding_window_view(arr, self.span_tokens)
        return [row.tobytes() for row in view]

    def add(self, namespace: str, tokens: Sequence[int]) -> None:
        self._windows.setdefault(namespace, set()).update(self._rows(tokens))

    def covered(self, namespace: str, tokens: Sequence[int]) -> int:
        """Prompt tokens inside at least one window that a resident donor of ``namespace`` contains."""
        windows = self._windows.get(namespace)
        if not windows:
            return 0
        hits = [start for start, row in enumerate(self._rows(tokens)) if row in windows]
        if not hits:
            return 0
        mark = np.zeros(len(tokens) + 1, dtype=np.int64)
        starts = np.asarray(hits)
        np.add.at(mark, starts, 1)
        np.add.at(mark, starts + self.span_tokens, -1)
        return int(np.count_nonzero(np.cumsum(mark)[: len(tokens)]))
