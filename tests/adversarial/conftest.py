"""The adversarial suite reuses the connector tests' harness factory and helpers."""

from __future__ import annotations

from tests.connector.conftest import clock, make_harness

__all__ = ["clock", "make_harness"]
