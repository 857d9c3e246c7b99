"""Prometheus metrics of the connector (process-wide, registered once on import)."""

from __future__ import annotations

import functools
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "semblend_connector_decisions_total",
    "get_num_new_matched_tokens decisions by outcome and decline reason",
    ["outcome", "reason"],
)
PROMISED_TOKENS = Counter("semblend_connector_promised_tokens_total", "tokens promised to TensorRT-LLM")
MATERIALIZED_TOKENS = Counter(
    "semblend_connector_materialized_tokens_total",
    "tokens whose donor KV copy completed on the device, by lineage (exact / approximate)",
    ["lineage"],
)
DONORS = Counter("semblend_connector_donors_total", "donor lifecycle transitions", ["event"])
PINNED_BLOCKS = Gauge("semblend_connector_pinned_blocks", "blocks held by pinned donors (incl. pending release)")
DECISION_LATENCY = Histogram(
    "semblend_connector_decision_seconds",
    "time spent in get_num_new_matched_tokens",
    buckets=(25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 5e-3, 2e-2),
)


@functools.cache
def decisions(outcome: str, reason: str = "") -> Any:
    """The ``DECISIONS`` series of these labels, looked up once (``labels()`` locks and builds its key every call)."""
    return DECISIONS.labels(outcome, reason)
