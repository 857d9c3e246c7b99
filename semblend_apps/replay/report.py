"""What ``semblend-dynamo replay`` reports: one :class:`RequestReport` per request and the run's :class:`ReplayReport`."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.pipeline import StageTimings

from .workload import RequestKind


class ReplayClass(str, Enum):
    """How one replayed request ended (the columns of the replay table)."""

    EXACT = "exact"  # exact prefix overlap won: routed on exact evidence
    DISCOVERY_ONLY = "discovery_only"  # evidence found, reported only (SEMBLEND_DISCOVERY_ONLY=1)
    PLACEMENT = "placement"  # similarity evidence only: placed on the donor's worker, nothing to load
    WOULD_MATERIALIZE = "would_materialize"  # the plan passed every gate (no backend in the chain)
    MATERIALIZED = "materialized"  # a backend confirmed loading donor KV
    BACKEND_DECLINED = "backend_declined"  # a backend refused an accepted plan
    DECLINED = "declined"  # evidence or bad input, declined by a gate (see the reason)
    COLD = "cold"  # no evidence at all


class RequestReport(BaseModel):
    """One replayed request."""

    request_id: str
    trace_id: str
    kind: RequestKind
    variant: str
    transform: str
    replay_class: ReplayClass
    outcome: Outcome
    reason: DeclineReason | None
    prompt_tokens: int
    exact_prefix_tokens: int
    reused_tokens: int = Field(description="tokens the plan would load (or the backend loaded)")
    planned_tokens: int = Field(0, description="tokens of the plan (accepted or not), 0 without one")
    chain_steps: int = Field(0, description="prefill-only steps a prefill chain ran before the request")
    chain_step_tokens: int = Field(0, description="donor tokens those steps loaded (reach, not the request's reuse)")
    donor_count: int = Field(0, description="donors the request was built from (a manifest item: its donors)")
    donor_covered_tokens: int = Field(description="prompt tokens inside token-exact windows of resident donors")
    similarity: float | None = None
    primary_donor: str | None
    primary_is_related: bool = Field(description="the primary donor is one the request was derived from")
    timings_us: StageTimings


class ReplayReport(BaseModel):
    """The machine-readable replay result (``--json``)."""

    config: dict[str, Any]
    workload: dict[str, Any]
    outcomes: dict[str, int]
    declined_by_reason: dict[str, int]
    by_kind: dict[str, dict[str, int]]
    expected_classes: list[str]
    missing_classes: list[str]
    prompt_tokens: int
    reused_tokens: int
    by_transform: dict[str, dict[str, Any]]
    reach: dict[str, Any] = Field(
        default_factory=dict, description="a manifest's donor-covered tokens served from donor KV (reuse transforms)"
    )
    negative_controls: dict[str, int]
    latency_us: dict[str, dict[str, float | int]]
    donor_registration_s: float
    counters: dict[str, int]
    audit_path: str
    notices: list[str]
    requests: list[RequestReport] = Field(default_factory=list, exclude=True)
