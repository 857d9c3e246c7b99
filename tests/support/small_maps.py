"""Block maps (``U64Map``) small enough that a test's few thousand entries rewrite their bases in many steps."""

from __future__ import annotations

import pytest

from semblend_dynamo.router import u64map


def small_block_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlays of 256 entries at least, rewrites in steps of 64 to 128 base entries whatever the change's size."""
    monkeypatch.setattr(u64map, "_MIN_OVERLAY", 256)
    monkeypatch.setattr(u64map, "_OVERLAY_PER_ROOT", 1)
    monkeypatch.setattr(u64map, "_MIN_STEP", 64)
    monkeypatch.setattr(u64map, "_MAX_STEP", 128)
    monkeypatch.setattr(u64map, "_STEP_PER_CHANGE", 0)
