"""The prefill chain: reuse donor spans that sit behind a recipient's own words, on an unmodified engine.

A TensorRT-LLM connector can only promise tokens right after what the engine already holds. A recipient laid out as
``[own words][donor evidence][own words][donor evidence]...[own question]`` therefore gets nothing from a plain
load. The chain gets it anyway: the router sends, for each gap of own words that precedes a load, a prefill-only
request for the recipient's prefix up to that gap's end; each one finds the previous step in the engine's prefix cache
(all steps carry the recipient's isolation salt) and the connector loads the next donor span after it. The real
request then loads the last span and computes the tail.

:func:`plan_chain` turns aligned spans into that sequence:

* spans are ordered by target position; target-adjacent spans (reordered RAG chunks) form one load even when their
  deltas differ;
* a gap's end is rounded *up* to a block boundary after ``head_tokens`` more tokens, so every load starts on a block
  and the first tokens of each span are recomputed in the new context (recomputing the head of a reused chunk
  recovers most of the quality lost to the changed context); a load ends on the last whole block it covers;
* the plan pays only when its predicted cost (steps x per-step overhead + computed tokens, in prefill-token units)
  beats a cold prefill by ``min_speedup`` and its deviation estimate passes the gate.

Every load of a chain is approximate KV (its preceding context differs from the donor's), whatever its delta.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from .config import SemblendConfig
from .outcomes import DeclineReason
from .planner import span_deviation
from .span_aligner import Span

__all__ = ["ChainDecision", "ChainLoad", "ChainPlan", "ChainRequest", "ChainSettings", "chain_requests", "plan_chain"]


class ChainSettings(BaseModel):
    """What :func:`plan_chain` needs from the configuration."""

    model_config = ConfigDict(frozen=True)

    block_size: int = Field(gt=0)
    head_tokens: int = Field(16, ge=0, description="tokens at the head of each span recomputed in the new context")
    step_overhead_tokens: int = Field(
        256, ge=0, description="cost of one extra scheduling round trip, in prefill-token equivalents"
    )
    min_speedup: float = Field(1.5, ge=1.0, description="predicted cold / chain cost a chain must reach")
    max_steps: int = Field(4, ge=1, description="most prefill-only steps before the real request")
    min_load_tokens: int = Field(64, ge=1, description="shortest load worth a step")
    max_deviation: float = Field(0.35, ge=0.0, le=1.0, description="deviation gate on the loaded tokens")

    @classmethod
    def from_config(cls, cfg: SemblendConfig) -> ChainSettings:
        return cls(
            block_size=cfg.block_size,
            head_tokens=cfg.chain_head_tokens,
            step_overhead_tokens=cfg.chain_step_overhead_tokens,
            min_speedup=cfg.chain_min_speedup,
            max_steps=cfg.chain_max_steps,
            min_load_tokens=cfg.min_span_tokens,
            max_deviation=cfg.chain_max_deviation,
        )


class ChainLoad(BaseModel):
    """One promise of the chain: target-contiguous, block-aligned donor spans loaded after ``start`` tokens."""

    model_config = ConfigDict(frozen=True)

    spans: list[Span]

    @property
    def start(self) -> int:
        return self.spans[0].target_start

    @property
    def end(self) -> int:
        return self.spans[-1].target_end

    @property
    def tokens(self) -> int:
        return self.end - self.start


class ChainPlan(BaseModel):
    """The requests of one chain: ``step_prefixes[i]`` is the prompt length of prefill-only step ``i``.

    Step ``i`` computes the gap before ``loads[i]`` (after loading ``loads[i-1]``); the real request loads the last
    load and computes the tail.
    """

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = Field(gt=0)
    loads: list[ChainLoad]
    step_prefixes: list[int]
    loaded_tokens: int = Field(ge=0)
    computed_tokens: int = Field(ge=0)
    predicted_cost: float = Field(ge=0.0, description="chain cost in prefill-token units")
    predicted_speedup: float = Field(ge=0.0, description="cold cost / chain cost")
    estimated_deviation: float = Field(ge=0.0)

    @property
    def spans(self) -> list[Span]:
        return [s for load in self.loads for s in load.spans]

    @property
    def steps(self) -> int:
        return len(self.step_prefixes)


class ChainRequest(BaseModel):
    """One request of a chain: the recipient's first ``prompt_tokens`` tokens, loading ``load`` after what is held."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = Field(gt=0)
    load: ChainLoad | None
    final: bool


def chain_requests(plan: ChainPlan, *, device_prefix_tokens: int = 0) -> list[ChainRequest]:
    """The requests that run ``plan``, in order: prefill-only steps, then the real request (``final``).

    Each request finds the previous one in the engine's prefix cache (same isolation salt), so the tokens it holds
    when the connector is asked are the previous request's prompt; it loads the load that starts there.
    """
    by_start = {load.start: load for load in plan.loads}
    out: list[ChainRequest] = []
    held = device_prefix_tokens
    for prefix in [*plan.step_prefixes, plan.prompt_tokens]:
        out.append(ChainRequest(prompt_tokens=prefix, load=by_start.get(held), final=prefix == plan.prompt_tokens))
        held = prefix
    return out


class ChainDecision(BaseModel):
    """A chain to run, or why not (``plan`` may hold the rejected plan for telemetry)."""

    plan: ChainPlan | None
    reason: DeclineReason | None = None
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.reason is None and self.plan is not None


def plan_chain(
    target_len: int, spans: Sequence[Span], settings: ChainSettings, *, device_prefix_tokens: int = 0
) -> ChainDecision:
    """Plan a prefill chain for a target of ``target_len`` tokens from aligned, non-overlapping ``spans``."""
    bs = settings.block_size
    limit = (target_len - 1) // bs * bs  # whole blocks only, at least one prompt token left to compute
    ordered = sorted((s for s in spans if s.target_end > device_prefix_tokens), key=lambda s: s.target_start)
    if not ordered:
        return _decline(DeclineReason.NO_CANDIDATE, "no token-exact span past the device prefix")
    loads: list[ChainLoad] = []
    for group in _adjacent_groups(ordered):
        start = _round_up(max(group[0].target_start + settings.head_tokens, device_prefix_tokens), bs)
        end = min(group[-1].target_end // bs * bs, limit)
        if loads and start < loads[-1].end:
            start = loads[-1].end
        if end - start < settings.min_load_tokens:
            continue
        clipped = [_clip(s, start, end) for s in group if s.target_end > start and s.target_start < end]
        loads.append(ChainLoad(spans=clipped))
    if not loads:
        return _decline(
            DeclineReason.BELOW_MIN_SPAN, f"no load of >= {settings.min_load_tokens} tokens after head recompute"
        )
    # Step k holds [0, start of load k): it loads load k-1 and computes the gap before load k. A first load that
    # starts at the device prefix needs no step: the request's own prefix hit precedes it.
    steps = [load.start for i, load in enumerate(loads) if i > 0 or load.start > device_prefix_tokens]
    loaded = sum(load.tokens for load in loads)
    computed = target_len - device_prefix_tokens - loaded
    cost = len(steps) * settings.step_overhead_tokens + computed
    cold = float(target_len - device_prefix_tokens)
    speedup = cold / cost if cost > 0 else float("inf")
    deviation = _deviation(loads, settings.head_tokens)
    plan = ChainPlan(
        prompt_tokens=target_len,
        loads=loads,
        step_prefixes=steps,
        loaded_tokens=loaded,
        computed_tokens=computed,
        predicted_cost=float(cost),
        predicted_speedup=speedup,
        estimated_deviation=deviation,
    )
    if len(steps) > settings.max_steps:
        return _decline(
            DeclineReason.TOO_MANY_SPANS, f"{len(steps)} steps > chain max_steps {settings.max_steps}", plan
        )
    if speedup < settings.min_speedup:
        return _decline(
            DeclineReason.CHAIN_DOES_NOT_PAY,
            f"predicted speedup {speedup:.2f} < chain min_speedup {settings.min_speedup}",
            plan,
        )
    if deviation > settings.max_deviation:
        return _decline(
            DeclineReason.DEVIATION_TOO_HIGH, f"estimated deviation {deviation:.3f} > {settings.max_deviation}", plan
        )
    return ChainDecision(plan=plan)


def _adjacent_groups(ordered: Sequence[Span]) -> list[list[Span]]:
    groups: list[list[Span]] = []
    for span in ordered:
        if groups and span.target_start == groups[-1][-1].target_end:
            groups[-1].append(span)
        else:
            groups.append([span])
    return groups


def _deviation(loads: Sequence[ChainLoad], head_tokens: int) -> float:
    """Token-weighted deviation of the loaded tokens; a span's first ``head_tokens`` were recomputed, not loaded."""
    total = sum(load.tokens for load in loads)
    if total == 0:
        return 0.0
    weighted = sum(s.length * span_deviation(s.length, s.delta, skipped=head_tokens) for s in _spans(loads))
    return weighted / total


def _spans(loads: Sequence[ChainLoad]) -> list[Span]:
    return [s for load in loads for s in load.spans]


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


def _clip(span: Span, start: int, end: int) -> Span:
    lo, hi = max(span.target_start, start), min(span.target_end, end)
    return Span(
        donor_id=span.donor_id, donor_start=span.donor_start + (lo - span.target_start), target_start=lo, length=hi - lo
    )


def _decline(reason: DeclineReason, detail: str, plan: ChainPlan | None = None) -> ChainDecision:
    return ChainDecision(plan=plan, reason=reason, detail=detail)
