"""Quality gates that turn aligned spans into a materialization plan or a decline reason.

The planner is pure: it sees the target length, the spans the aligner found, the embedding similarity (if
any was computed) and how many prompt tokens the device already holds (exact prefix cache). Every failure
is a :class:`~semblend_dynamo.outcomes.DeclineReason`; it never raises on its input.

Span kinds:

* *exact-equivalent*: delta 0 and starting at target position 0 (or continuing such a span of the same
  donor): same tokens, same positions, same preceding context, so the donor KV equals a fresh prefill.
* *shifted*: anything else. The tokens match but sit at new positions (RoPE delta) after a different
  preceding context, so the KV is an approximation; allowed only with ``exact_materialization_only=0``,
  and gated by the similarity, the deviation estimate and isolation.

The deviation estimate (:func:`estimate_deviation`) is a heuristic, not a measurement: see docs/pipeline.md.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from . import native_planner
from .config import SemblendConfig
from .outcomes import DeclineReason
from .span_aligner import Span

__all__ = [
    "BOUNDARY_DECAY_TOKENS",
    "CONTEXT_FLOOR",
    "MaterializationPlan",
    "PlanDecision",
    "Planner",
    "estimate_deviation",
    "span_deviation",
]

BOUNDARY_DECAY_TOKENS = 16.0
"""Tokens over which the deviation after a changed-context boundary decays by 1/e (EPIC recomputes ~16)."""
CONTEXT_FLOOR = 0.05
"""Deviation that remains deep inside a shifted span: its long-range context still differs."""
ROPE_NUMERIC = 0.01
"""Deviation added per log2(1 + |delta|) / 17 for the fp32 rotation error (about 2x the bf16 floor at 1e5)."""
EXACT_ONLY_DETAIL = "no exact-equivalent span (delta 0 from position 0); shifted spans off"
"""The ``exact_only_mode`` decline's detail (the compiled path makes this decline too)."""
DISPLACEMENT_WEIGHT = 0.3
DISPLACEMENT_TOKENS = 1000.0
"""Context-displacement term ``DISPLACEMENT_WEIGHT * min(2, |delta| / DISPLACEMENT_TOKENS)``: fidelity loss on the
engine-in-the-loop benchmark tracked |delta| (KL <= 0.035 up to 500, perplexity +64% at 2000), so with the default
``max_deviation`` (0.35) long spans pass up to |delta| ~ 900 and are declined beyond."""


@dataclass(slots=True)
class MaterializationPlan:
    """Which donor spans to load for a target, all block-aligned on the target side."""

    spans: list[Span]
    prompt_tokens: int
    reused_tokens: int
    """Tokens loaded from donors (beyond the device prefix)."""
    reuse_ratio: float
    """``reused_tokens / prompt_tokens``."""
    requires_rope_correction: bool
    estimated_deviation: float
    """The bathtub estimate, 0 for exact-equivalent plans."""
    mode: str
    """``"exact"`` (every span exact-equivalent) or ``"shifted"``."""

    @property
    def donor_ids(self) -> list[str]:
        """Donors used, in target order, without repeats."""
        return list(dict.fromkeys(s.donor_id for s in self.spans))


@dataclass(slots=True)
class PlanDecision:
    """The planner's verdict: accepted when ``reason`` is None.

    On a ``discovery_only`` decline ``plan`` still holds the plan that passed every other gate (telemetry:
    what would have been materialized); on any other decline it is None. Slotted dataclasses, not pydantic models:
    the planner runs on every scheduler decision and builds them from values it computed itself.
    """

    plan: MaterializationPlan | None
    reason: DeclineReason | None
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.reason is None and self.plan is not None


def span_deviation(length: int, delta: int, *, skipped: int = 0) -> float:
    """Estimated mean deviation of a shifted span's KV from a fresh prefill, in [0, 1].

    Per token at distance k after the changed-context boundary: ``floor + (1 - floor) * exp(-k / tau)``, averaged
    over the span (closed form), plus a context-displacement term growing with |delta| and a small RoPE-numerics
    term growing with log |delta|. ``skipped`` tokens after the boundary were recomputed in the new context, so the
    span's first loaded token sits at k = ``skipped``.
    """
    if length <= 0:
        return 0.0
    tau = BOUNDARY_DECAY_TOKENS
    boundary = tau / length * math.exp(-skipped / tau) * (1.0 - math.exp(-length / tau))
    rope = ROPE_NUMERIC * math.log2(1 + abs(delta)) / 17.0
    displacement = DISPLACEMENT_WEIGHT * min(2.0, abs(delta) / DISPLACEMENT_TOKENS)
    return min(1.0, CONTEXT_FLOOR + (1.0 - CONTEXT_FLOOR) * boundary + displacement + rope)


def estimate_deviation(spans: Sequence[Span], exact_equivalent: Sequence[bool], *, skipped: int = 0) -> float:
    """Token-weighted mean deviation over the shifted spans' tokens (0 when every span is exact-equivalent).

    Exact-equivalent spans are left out of the mean: their KV is exact, but it does not make the approximate KV
    after them any better. (Averaging them in let a 64-token shifted span after a 64-token exact system prompt pass
    at half its estimate; on SmolLM2 it changed the greedy answer: docs/quality.md.) ``skipped``: tokens after each
    span's changed-context boundary that were recomputed, not loaded (a prefill chain's head recompute).
    """
    shifted = [s for s, exact in zip(spans, exact_equivalent, strict=True) if not exact]
    total = sum(s.length for s in shifted)
    if total == 0:
        return 0.0
    return sum(s.length * span_deviation(s.length, s.delta, skipped=skipped) for s in shifted) / total


class Planner:
    """Applies the configured gates; one instance per config, stateless between calls."""

    def __init__(self, cfg: SemblendConfig) -> None:
        self.cfg = cfg

    def plan(
        self,
        target_len: int,
        spans: Sequence[Span],
        *,
        similarity: float | None = None,
        device_prefix_tokens: int = 0,
        approximate_donors: Collection[str] = (),
        chain_head_tokens: int | None = None,
    ) -> PlanDecision:
        """Decide for one target of ``target_len`` tokens whose first ``device_prefix_tokens`` are on device.

        ``spans`` come from :meth:`SpanAligner.align` (any order; overlapping spans are an error decline).
        ``similarity`` is the embedding similarity of the target to the donors, None when not computed.
        Spans of ``approximate_donors`` (donors whose own KV is approximate) are never exact-equivalent.
        ``chain_head_tokens`` marks one request of a prefill chain: the chain planner already weighed the reuse of the
        whole chain (no reuse-ratio gate here), and each span's first ``chain_head_tokens`` tokens were recomputed.
        """
        cfg = self.cfg
        if NATIVE_ACCEPT is not None and spans:  # the compiled accepting path (and exact_only_mode); None: this decides
            decided: PlanDecision | None = NATIVE_ACCEPT(
                cfg, target_len, spans, similarity, device_prefix_tokens, approximate_donors, chain_head_tokens
            )
            if decided is not None:
                return decided
        bs = cfg.block_size
        if target_len <= 0:
            return _decline(DeclineReason.EMPTY_PROMPT, "prompt has no tokens")
        if not cfg.enabled:
            return _decline(DeclineReason.SEMANTIC_DISABLED, "SEMBLEND_ENABLED=0")
        if target_len <= bs:
            return _decline(DeclineReason.PROMPT_TOO_SHORT, f"{target_len} tokens: need more than one block ({bs})")
        if device_prefix_tokens < 0 or device_prefix_tokens % bs:
            return _decline(
                DeclineReason.ALIGNMENT_NOT_BLOCK_ALIGNED, f"device prefix {device_prefix_tokens} is not whole blocks"
            )
        # Whole blocks only, and at least one prompt token left to compute.
        limit = (target_len - 1) // bs * bs
        if device_prefix_tokens >= limit:
            return _decline(DeclineReason.EXACT_PREFIX_WINS, f"device already holds {device_prefix_tokens} tokens")
        if not spans:
            return _decline(DeclineReason.NO_CANDIDATE, "no token-exact span")

        # One pass per stage over the spans, no generator per gate (the planner runs on every scheduler decision,
        # with cold caches); tests/core/test_planner_reference.py holds it to the decisions of the earlier loops.
        ordered = sorted(spans, key=_TARGET_START)
        prev_end = -1
        for span in ordered:
            if span.target_start < prev_end:
                return _decline(DeclineReason.INTERNAL_ERROR, "spans overlap on the target")
            prev_end = span.target_start + span.length
        if prev_end > target_len:
            return _decline(DeclineReason.INTERNAL_ERROR, "a span ends past the prompt")

        # Exact-equivalent: delta 0 from position 0 (or directly continuing such a span of the same donor), from a
        # donor whose own KV is exact. Then trim inward to target blocks, clip to [device prefix, limit).
        min_span = cfg.min_span_tokens
        long_enough: list[tuple[Span, bool]] = []
        kept = vanished = past_prefix = longest = 0
        prev: Span | None = None
        prev_exact = False
        for span in ordered:
            ts = span.target_start
            te = ts + span.length
            if span.donor_start != ts or span.donor_id in approximate_donors:
                is_exact = False
            elif ts == 0:
                is_exact = True
            else:
                is_exact = (
                    prev is not None
                    and prev_exact
                    and prev.donor_id == span.donor_id
                    and prev.target_start + prev.length == ts
                )
            prev, prev_exact = span, is_exact
            if te <= device_prefix_tokens:
                past_prefix += 1
                continue
            start = max(-(-ts // bs) * bs, device_prefix_tokens)
            end = min(te // bs * bs, limit)
            if end <= start:
                vanished += 1
                continue
            kept += 1
            if end - start > longest:
                longest = end - start
            if end - start >= min_span:
                long_enough.append((span if start == ts and end == te else _clip(span, start, end), is_exact))
        if not kept:
            if past_prefix and not vanished:
                return _decline(DeclineReason.EXACT_PREFIX_WINS, "every span lies inside the device prefix")
            return _decline(DeclineReason.ALIGNMENT_NOT_BLOCK_ALIGNED, "no span covers a whole target block")
        if not long_enough:
            return _decline(
                DeclineReason.BELOW_MIN_SPAN, f"longest usable span {longest} < min_span_tokens {cfg.min_span_tokens}"
            )

        chosen = long_enough
        if cfg.exact_materialization_only:
            lead = 0
            while lead < len(chosen) and chosen[lead][1]:
                lead += 1
            if lead == 0:
                return _decline(DeclineReason.EXACT_ONLY_MODE, EXACT_ONLY_DETAIL)
            chosen = chosen[:lead]
        if cfg.strict_prefix_boundary:
            if chosen[0][0].target_start != device_prefix_tokens:
                return _decline(
                    DeclineReason.NOT_PREFIX_CONTIGUOUS,
                    f"first span starts at {chosen[0][0].target_start}, the device prefix ends at {device_prefix_tokens}",
                )
            tiled = 1
            while tiled < len(chosen) and chosen[tiled][0].target_start == chosen[tiled - 1][0].target_end:
                tiled += 1
            chosen = chosen[:tiled]
        if len(chosen) > cfg.max_spans:
            return _decline(DeclineReason.TOO_MANY_SPANS, f"{len(chosen)} spans > max_spans {cfg.max_spans}")

        # The deviation's terms are gathered in the same pass (no comprehension frames): the shifted spans' lengths and
        # their length-weighted estimates, in target order, summed below exactly as estimate_deviation sums them.
        plan_spans: list[Span] = []
        shifted_lengths: list[int] = []
        weighted: list[float] = []
        skipped = chain_head_tokens or 0
        reused = 0
        moves = False
        for span, is_exact in chosen:
            plan_spans.append(span)
            length = span.length
            reused += length
            if not is_exact:
                delta = span.target_start - span.donor_start
                shifted_lengths.append(length)
                weighted.append(length * span_deviation(length, delta, skipped=skipped))
                if delta:  # an exact-equivalent span never moves (its donor and target starts are equal)
                    moves = True
        ratio = reused / target_len
        if chain_head_tokens is None and ratio < cfg.min_reuse_ratio:
            return _decline(
                DeclineReason.BELOW_REUSE_RATIO,
                f"reuse {reused}/{target_len} = {ratio:.3f} < min_reuse_ratio {cfg.min_reuse_ratio}",
            )
        shifted = bool(shifted_lengths)
        # Exact-equivalent spans have no deviation: the estimate as estimate_deviation makes it, token-weighted over
        # the shifted spans, summed in this order.
        deviation = 0.0
        if shifted:
            deviation = sum(weighted) / sum(shifted_lengths)
            if similarity is not None and not similarity >= cfg.min_similarity:
                return _decline(
                    DeclineReason.BELOW_SIMILARITY,
                    f"similarity {similarity:.3f} < min_similarity {cfg.min_similarity} for shifted spans",
                )
            if deviation > cfg.max_deviation:
                return _decline(
                    DeclineReason.DEVIATION_TOO_HIGH,
                    f"estimated deviation {deviation:.3f} > max_deviation {cfg.max_deviation}",
                )
            if cfg.isolation == "none":
                return _decline(
                    DeclineReason.ISOLATION_REQUIRED,
                    "shifted spans need SEMBLEND_ISOLATION (cache_salt/no_block_reuse)",
                )
        plan = MaterializationPlan(
            spans=plan_spans,
            prompt_tokens=target_len,
            reused_tokens=reused,
            reuse_ratio=ratio,
            requires_rope_correction=shifted and moves,
            estimated_deviation=deviation,
            mode="shifted" if shifted else "exact",
        )
        if cfg.discovery_only:
            return PlanDecision(plan=plan, reason=DeclineReason.DISCOVERY_ONLY, detail="SEMBLEND_DISCOVERY_ONLY=1")
        return PlanDecision(plan=plan, reason=None)


_TARGET_START = operator.attrgetter("target_start")


def _decline(reason: DeclineReason, detail: str) -> PlanDecision:
    return PlanDecision(plan=None, reason=reason, detail=detail)


def _clip(span: Span, start: int, end: int) -> Span:
    if start == span.target_start and end == span.target_end:
        return span
    return Span(
        donor_id=span.donor_id,
        donor_start=span.donor_start + (start - span.target_start),
        target_start=start,
        length=end - start,
    )


_CONSTANTS = (BOUNDARY_DECAY_TOKENS, CONTEXT_FLOOR, ROPE_NUMERIC, DISPLACEMENT_WEIGHT, DISPLACEMENT_TOKENS)
NATIVE_ACCEPT, NATIVE_REASON = native_planner.use(
    (Span, MaterializationPlan, PlanDecision, sum, _CONSTANTS, DeclineReason.EXACT_ONLY_MODE, EXACT_ONLY_DETAIL)
)
"""The compiled accepting path (:mod:`semblend_dynamo.native_planner`) and why it is (not) used; it makes the
``exact_only_mode`` decline too (the router's usual one: spans found, none exact-equivalent)."""
if NATIVE_ACCEPT is None:
    logging.getLogger(__name__).log(
        logging.INFO if native_planner.disabled() else logging.WARNING, "planner: Python only (%s)", NATIVE_REASON
    )
