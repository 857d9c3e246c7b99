"""The planner as it was before issue 16.2's seventh pass (its plain loops): the oracle of
``tests/core/test_planner_reference.py``. A verbatim copy of ``Planner.plan``, its helpers and
the deviation estimate; do not change it."""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Collection, Sequence

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.planner import (
    BOUNDARY_DECAY_TOKENS,
    CONTEXT_FLOOR,
    DISPLACEMENT_TOKENS,
    DISPLACEMENT_WEIGHT,
    ROPE_NUMERIC,
    MaterializationPlan,
    PlanDecision,
)
from semblend_dynamo.span_aligner import Span


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


class ReferencePlanner:
    """The planner before the seventh pass."""

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

        ordered = sorted(spans, key=_TARGET_START)
        for prev, cur in itertools.pairwise(ordered):
            if cur.target_start < prev.target_end:
                return _decline(DeclineReason.INTERNAL_ERROR, "spans overlap on the target")
        if ordered[-1].target_end > target_len:
            return _decline(DeclineReason.INTERNAL_ERROR, "a span ends past the prompt")
        exact = _exact_equivalence(ordered, approximate_donors)

        # Trim inward to target blocks, clip to [device prefix, limit).
        kept: list[tuple[Span, bool]] = []
        vanished = past_prefix = 0
        for span, is_exact in zip(ordered, exact, strict=True):
            start = max(-(-span.target_start // bs) * bs, device_prefix_tokens)
            end = min(span.target_end // bs * bs, limit)
            if span.target_end <= device_prefix_tokens:
                past_prefix += 1
                continue
            if end <= start:
                vanished += 1
                continue
            kept.append((_clip(span, start, end), is_exact))
        if not kept:
            if past_prefix and not vanished:
                return _decline(DeclineReason.EXACT_PREFIX_WINS, "every span lies inside the device prefix")
            return _decline(DeclineReason.ALIGNMENT_NOT_BLOCK_ALIGNED, "no span covers a whole target block")
        long_enough = [(s, e) for s, e in kept if s.length >= cfg.min_span_tokens]
        if not long_enough:
            longest = max(s.length for s, _ in kept)
            return _decline(
                DeclineReason.BELOW_MIN_SPAN, f"longest usable span {longest} < min_span_tokens {cfg.min_span_tokens}"
            )

        chosen = long_enough
        if cfg.exact_materialization_only:
            lead = 0
            while lead < len(chosen) and chosen[lead][1]:
                lead += 1
            if lead == 0:
                return _decline(
                    DeclineReason.EXACT_ONLY_MODE,
                    "no exact-equivalent span (delta 0 from position 0); shifted spans off",
                )
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

        plan_spans = [s for s, _ in chosen]
        plan_exact = [e for _, e in chosen]
        reused = sum(s.length for s in plan_spans)
        ratio = reused / target_len
        if chain_head_tokens is None and ratio < cfg.min_reuse_ratio:
            return _decline(
                DeclineReason.BELOW_REUSE_RATIO,
                f"reuse {reused}/{target_len} = {ratio:.3f} < min_reuse_ratio {cfg.min_reuse_ratio}",
            )
        shifted = not all(plan_exact)
        # Exact-equivalent spans have no deviation and no RoPE delta: the estimate and the delta scan are for shifted.
        deviation = estimate_deviation(plan_spans, plan_exact, skipped=chain_head_tokens or 0) if shifted else 0.0
        if shifted:
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
            requires_rope_correction=shifted and any(s.delta != 0 for s in plan_spans),
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


def _exact_equivalence(ordered: Sequence[Span], approximate_donors: Collection[str] = ()) -> list[bool]:
    """Exact-equivalent: delta 0 from position 0 (or directly continuing such a span of the same donor), from a donor
    whose own KV is exact."""
    out: list[bool] = []
    for i, span in enumerate(ordered):
        if span.delta != 0 or span.donor_id in approximate_donors:
            out.append(False)
        elif span.target_start == 0:
            out.append(True)
        else:
            prev = ordered[i - 1] if i else None
            out.append(
                prev is not None and out[-1] and prev.donor_id == span.donor_id and prev.target_end == span.target_start
            )
    return out
