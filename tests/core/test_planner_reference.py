"""The planner decides exactly what its previous implementation decided (tests/support/reference_planner.py).

Its loops changed (one pass over the spans, no generator per gate, the deviation estimate inline); its answers must
not: the same decision, reason, detail text, plan spans and float fields bit for bit, for random spans (overlapping,
out of order, several donors, approximate donors), device prefixes, similarities, chain heads and gate settings.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.planner import Planner
from semblend_dynamo.span_aligner import Span
from tests.support.reference_planner import ReferencePlanner

BS = 32

spans_st = st.lists(
    st.builds(
        Span,
        donor_id=st.sampled_from(["a", "b", "c"]),
        donor_start=st.integers(0, 2000),
        target_start=st.integers(0, 1200),
        length=st.integers(1, 900),
    ),
    max_size=5,
)
configs_st = st.fixed_dictionaries(
    {
        "exact_materialization_only": st.booleans(),
        "strict_prefix_boundary": st.booleans(),
        "discovery_only": st.booleans(),
        "enabled": st.sampled_from([True, True, True, False]),
        "min_span_tokens": st.sampled_from([1, 32, 64, 200]),
        "min_reuse_ratio": st.sampled_from([0.0, 0.1, 0.3, 0.9]),
        "max_spans": st.sampled_from([1, 2, 8]),
        "max_deviation": st.sampled_from([0.05, 0.35, 1.0]),
        "min_similarity": st.sampled_from([0.0, 0.5, 0.9]),
        "isolation": st.sampled_from(["none", "cache_salt", "no_block_reuse"]),
    }
)


def plan_kwargs(
    device_blocks: int, device_offset: int, similarity: float | None, approximate: Any, chain_head: int | None
) -> dict[str, Any]:
    """`Planner.plan`'s keyword arguments from the property tests' drawn values."""
    return {
        "similarity": similarity,
        "device_prefix_tokens": device_blocks * BS + device_offset,
        "approximate_donors": approximate,
        "chain_head_tokens": chain_head,
    }


def decide(planner: Any, target_len: int, spans: list[Span], **kwargs: Any) -> tuple[Any, ...]:
    return summary(planner.plan(target_len, spans, **kwargs))


def summary(d: Any) -> tuple[Any, ...]:
    """A decision's reason, detail, verdict and plan fields (floats as their bits)."""
    plan = d.plan
    fields = (
        None
        if plan is None
        else (
            plan.spans,
            plan.prompt_tokens,
            plan.reused_tokens,
            plan.reuse_ratio.hex(),
            plan.requires_rope_correction,
            plan.estimated_deviation.hex(),
            plan.mode,
        )
    )
    return d.reason, d.detail, d.accepted, fields


@settings(max_examples=3000, deadline=None)
@given(
    cfg=configs_st,
    spans=spans_st,
    target_len=st.sampled_from([0, 1, 32, 33, 64, 200, 513, 1024, 1500]),
    device_blocks=st.integers(0, 20),
    device_offset=st.sampled_from([0, 0, 0, 5]),
    similarity=st.one_of(st.none(), st.floats(0.0, 1.0)),
    approximate=st.sets(st.sampled_from(["a", "b", "c"])),
    chain_head=st.one_of(st.none(), st.integers(0, 64)),
)
def test_the_planner_decides_what_the_reference_decided(
    cfg: dict[str, Any],
    spans: list[Span],
    target_len: int,
    device_blocks: int,
    device_offset: int,
    similarity: float | None,
    approximate: set[str],
    chain_head: int | None,
) -> None:
    # model_copy does not validate: shifted spans with isolation 'none' reach the planner's own isolation gate
    config = SemblendConfig(block_size=BS).model_copy(update=cfg)
    kwargs = plan_kwargs(device_blocks, device_offset, similarity, approximate, chain_head)
    assert decide(Planner(config), target_len, spans, **kwargs) == decide(
        ReferencePlanner(config), target_len, spans, **kwargs
    )


def test_a_shifted_hit_and_an_exact_hit_as_the_connector_plans_them() -> None:
    shifted = SemblendConfig(block_size=BS, exact_materialization_only=False, isolation="no_block_reuse")
    exact = SemblendConfig(block_size=BS)
    cases = [
        (shifted, [Span(donor_id="0:4", donor_start=40, target_start=0, length=6144)]),
        (exact, [Span(donor_id="0:4", donor_start=0, target_start=0, length=6144)]),
        (shifted, [Span(donor_id="a", donor_start=0, target_start=0, length=768), Span("b", 900, 768, 2048)]),
    ]
    for cfg, spans in cases:
        got = decide(Planner(cfg), 8192, spans)
        assert got == decide(ReferencePlanner(cfg), 8192, spans)
        assert got[2]  # accepted
