"""The span aligner's two paths, for tests that run both on the same inputs."""

from __future__ import annotations

from semblend_dynamo import _native


def aligner_paths() -> list[bool]:
    """``native`` values to test: numpy (False) always; the compiled core (True) unless ``SEMBLEND_NATIVE_ALIGNER``
    turns it off. A missing library then fails the test (``SpanAligner(native=True)`` raises): the test command
    builds it."""
    return [False] if _native.disabled() else [False, True]
