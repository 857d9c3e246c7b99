"""Shared helpers for the connector tests: a harness factory, prompts, a manual clock and audit queries."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from semblend_dynamo.audit import AuditRecord, AuditWriter
from semblend_dynamo.config import SemblendConfig
from trtllm_connector.harness import PyExecutorHarness

BLOCK = 8
BASE_SETTINGS: dict[str, Any] = {
    "block_size": BLOCK,
    "min_span_tokens": 16,
    "min_donor_tokens": 32,
    "min_reuse_ratio": 0.1,
    "pin_budget_fraction": 0.5,
}


class ManualClock:
    """A test clock for TTLs: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture()
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture()
def make_harness(clock: ManualClock) -> Iterator[Callable[..., PyExecutorHarness]]:
    """``make_harness(num_blocks=..., prefix_reuse=..., context_free=..., api=..., dtype=..., **settings)``: a harness
    with an in-memory audit and the context-dependent stand-in model (``context_free=True``: the bit-exact-shift
    oracle), speaking TensorRT-LLM API ``api`` ("1.2" or "1.3") over a KV pool of ``dtype``."""

    def build(
        *,
        num_blocks: int = 256,
        prefix_reuse: bool = False,
        audit: AuditWriter | None = None,
        geometry: dict[str, int] | None = None,
        context_free: bool = False,
        api: str = "1.3",
        dtype: torch.dtype = torch.bfloat16,
        **settings: Any,
    ) -> PyExecutorHarness:
        cfg = SemblendConfig(**{**BASE_SETTINGS, **settings})
        return PyExecutorHarness.with_stand_in(
            cfg,
            num_blocks=num_blocks,
            prefix_reuse=prefix_reuse,
            audit=audit,
            clock=clock,
            context_free=context_free,
            api=api,
            dtype=dtype,
            **(geometry or {}),
        )

    yield build


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 4000) for _ in range(n)]


def records(harness: PyExecutorHarness, event: str | None = None, request_id: int | None = None) -> list[AuditRecord]:
    out = harness.scheduler.audit.records or []
    return [
        r
        for r in out
        if (event is None or r.event == event) and (request_id is None or r.request_id == str(request_id))
    ]


def decline_reason(harness: PyExecutorHarness, request_id: int) -> str | None:
    declined = records(harness, "declined", request_id)
    return str(declined[-1].rejection_reason) if declined else None


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.float() - exact).norm() / exact.norm())
