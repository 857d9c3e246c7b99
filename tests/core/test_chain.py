"""The prefill-chain planner: loads, steps, head recompute, the cost and deviation gates."""

from __future__ import annotations

from semblend_dynamo.chain import ChainSettings, chain_requests, plan_chain
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.planner import span_deviation
from semblend_dynamo.span_aligner import Span

BS = 16


def settings(**kw: object) -> ChainSettings:
    base: dict[str, object] = {"block_size": BS, "head_tokens": 16, "step_overhead_tokens": 64, "min_load_tokens": 32}
    base.update(kw)
    return ChainSettings.model_validate(base)


def test_wrapper_before_evidence_is_one_step_then_the_real_request() -> None:
    # [40 own tokens][1000 donor tokens from donor position 8][60 own tokens]
    spans = [Span(donor_id="d", donor_start=8, target_start=40, length=1000)]
    decision = plan_chain(1100, spans, settings())
    assert decision.accepted, decision.detail
    plan = decision.plan
    assert plan is not None
    # the gap 0..40 plus 16 head tokens, rounded up to a block: 64
    assert [load.start for load in plan.loads] == [64]
    assert plan.loads[0].end == 1040 // BS * BS == 1040
    assert plan.step_prefixes == [64]
    assert plan.loaded_tokens == 1040 - 64
    assert plan.computed_tokens == 1100 - plan.loaded_tokens
    assert plan.predicted_cost == 64 + plan.computed_tokens
    # the loaded span starts 24 tokens into the donor span: donor offsets follow the target clip
    assert plan.loads[0].spans[0].donor_start == 8 + (64 - 40)


def test_adjacent_spans_with_different_deltas_form_one_load() -> None:
    # reordered RAG chunks: B then A, back to back in the target
    spans = [
        Span(donor_id="d", donor_start=500, target_start=32, length=480),
        Span(donor_id="d", donor_start=0, target_start=512, length=480),
    ]
    plan = plan_chain(1100, spans, settings()).plan
    assert plan is not None
    assert len(plan.loads) == 1
    assert [s.delta for s in plan.loads[0].spans] == [32 - 500, 512]
    assert plan.loads[0].start == 48 and plan.loads[0].end == 992


def test_two_separated_spans_need_two_steps() -> None:
    spans = [
        Span(donor_id="a", donor_start=0, target_start=30, length=600),
        Span(donor_id="b", donor_start=0, target_start=700, length=600),
    ]
    plan = plan_chain(1400, spans, settings()).plan
    assert plan is not None
    assert [load.start for load in plan.loads] == [48, 720]
    assert plan.step_prefixes == [48, 720]


def test_a_load_at_the_device_prefix_needs_no_step() -> None:
    spans = [Span(donor_id="a", donor_start=64, target_start=0, length=640)]
    plan = plan_chain(700, spans, settings(head_tokens=0)).plan
    assert plan is not None
    assert plan.step_prefixes == []


def test_longer_head_recompute_loads_less_and_lowers_the_deviation() -> None:
    spans = [Span(donor_id="d", donor_start=0, target_start=40, length=1000)]
    short = plan_chain(1100, spans, settings(head_tokens=0)).plan
    long = plan_chain(1100, spans, settings(head_tokens=64)).plan
    assert short is not None and long is not None
    assert long.loaded_tokens < short.loaded_tokens
    assert long.estimated_deviation < short.estimated_deviation
    assert span_deviation(100, 40, skipped=32) < span_deviation(100, 40)


def test_a_chain_that_does_not_pay_is_declined_with_its_plan() -> None:
    spans = [Span(donor_id="d", donor_start=0, target_start=40, length=200)]
    decision = plan_chain(1100, spans, settings(step_overhead_tokens=4000))
    assert decision.reason is DeclineReason.CHAIN_DOES_NOT_PAY
    assert decision.plan is not None and decision.plan.predicted_speedup < 1.5


def test_short_spans_and_no_spans_are_declined() -> None:
    assert plan_chain(500, [], settings()).reason is DeclineReason.NO_CANDIDATE
    tiny = [Span(donor_id="d", donor_start=0, target_start=40, length=40)]
    assert plan_chain(500, tiny, settings()).reason is DeclineReason.BELOW_MIN_SPAN


def test_too_many_steps_and_high_deviation_are_declined() -> None:
    spans = [Span(donor_id="d", donor_start=0, target_start=100 * i + 20, length=70) for i in range(8)]
    assert plan_chain(900, spans, settings(max_steps=2, min_load_tokens=16)).reason is DeclineReason.TOO_MANY_SPANS
    far = [Span(donor_id="d", donor_start=5000, target_start=40, length=1000)]
    assert plan_chain(1100, far, settings(max_deviation=0.05)).reason is DeclineReason.DEVIATION_TOO_HIGH


def test_the_last_prompt_token_is_never_loaded() -> None:
    spans = [Span(donor_id="d", donor_start=0, target_start=32, length=992)]
    plan = plan_chain(1024, spans, settings()).plan
    assert plan is not None
    assert plan.loads[-1].end <= 1023 // BS * BS


def test_chain_requests_load_each_span_after_the_previous_step() -> None:
    spans = [
        Span(donor_id="a", donor_start=0, target_start=30, length=600),
        Span(donor_id="b", donor_start=0, target_start=700, length=600),
    ]
    plan = plan_chain(1400, spans, settings()).plan
    assert plan is not None
    requests = chain_requests(plan)
    assert [(r.prompt_tokens, r.load.start if r.load else None, r.final) for r in requests] == [
        (48, None, False),  # computes the wrapper (and the first span's head)
        (720, 48, False),  # loads the first span after the first step, computes the gap
        (1400, 720, True),  # the real request loads the second span and computes the question
    ]


def test_a_chain_whose_first_load_starts_at_zero_loads_it_in_the_first_request() -> None:
    spans = [
        Span(donor_id="a", donor_start=64, target_start=0, length=600),
        Span(donor_id="b", donor_start=0, target_start=700, length=600),
    ]
    plan = plan_chain(1400, spans, settings(head_tokens=0)).plan
    assert plan is not None
    requests = chain_requests(plan)
    assert [(r.prompt_tokens, r.load.start if r.load else None) for r in requests] == [(704, 0), (1400, 704)]


def test_the_default_chain_gate_takes_one_long_span_and_declines_reordered_chunks() -> None:
    """Calibrated on SmolLM2 (docs/quality.md): single-span chains kept KL <= 0.013; chunked ones mostly missed the bar."""
    from semblend_dynamo.config import SemblendConfig

    defaults = ChainSettings.from_config(SemblendConfig(chain_step_overhead_tokens=0, chain_max_steps=8))
    wrapped = [Span(donor_id="d", donor_start=87, target_start=96, length=960)]
    assert plan_chain(1099, wrapped, defaults).accepted
    reordered = [
        Span(donor_id="d", donor_start=812, target_start=64, length=224),
        Span(donor_id="d", donor_start=610, target_start=320, length=192),
        Span(donor_id="d", donor_start=371, target_start=544, length=224),
        Span(donor_id="d", donor_start=93, target_start=800, length=256),
    ]
    decision = plan_chain(1086, reordered, defaults)
    assert decision.reason is DeclineReason.DEVIATION_TOO_HIGH
    assert decision.plan is not None and decision.plan.estimated_deviation < SemblendConfig().max_deviation
