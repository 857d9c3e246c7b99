"""A prefill chain through the reference engine (tiny random Llama, CPU): the salted prefix cache and the loads.

The recipient puts 64 tokens of its own before a donor's evidence. The chain's step computes them (and the head of
the span) under the recipient's isolating salt; the request finds the step's blocks in the engine's prefix cache and
the connector loads the rest of the span after them, K rotated by the position delta.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from benchmarks.engine_in_loop import chain_bench  # noqa: E402
from semblend_apps.reference_engine.hf_engine import HFReferenceEngine, cold_prefill  # noqa: E402
from semblend_apps.reference_engine.hf_model import cache_layers  # noqa: E402
from semblend_dynamo.chain import ChainSettings, plan_chain  # noqa: E402
from semblend_dynamo.namespace import isolating_salt  # noqa: E402
from semblend_dynamo.span_aligner import SpanAligner  # noqa: E402

from .test_engine_smoke import BLOCK, TINY_LLAMA  # noqa: E402

WRAPPER = 64
LENGTH = 1024


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(attn_implementation="sdpa", **TINY_LLAMA)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _chain_engine(model):
    cfg = chain_bench.chain_config(BLOCK)
    return cfg, HFReferenceEngine(model, cfg, num_blocks=256, prefix_reuse=True)


def _setup(model):
    cfg, engine = _chain_engine(model)
    donor, (prompt,) = chain_bench.targets(TINY_LLAMA["vocab_size"], LENGTH, 0.85, WRAPPER, 1, seed=3)
    donor_id = engine.donor_id(engine.run(donor, cache_salt=isolating_salt("t", "donor")))
    assert donor_id is not None
    aligner = SpanAligner(BLOCK, cfg.min_span_tokens)
    aligner.add_donor("d", "t", donor)
    decision = plan_chain(len(prompt), aligner.align("t", prompt), ChainSettings.from_config(cfg))
    assert decision.accepted and decision.plan is not None
    return engine, prompt, decision.plan, donor_id


def test_the_chain_step_is_reused_and_the_span_loaded_after_it(model) -> None:
    engine, prompt, plan, donor_id = _setup(model)
    head = plan.loads[0].start
    assert plan.steps == 1 and plan.step_prefixes == [head] and head == 96  # 64 own tokens + 16 head, to a block
    chain = engine.run_chain(prompt, plan, {"d": donor_id}, tenant="t", nonce="r1")
    step, final = chain.steps[0], chain.final
    assert step.device_matched == 0 and step.materialized == 0  # the step only computes the recipient's own words
    assert final.device_matched == head  # the step's blocks, found in the salted prefix cache
    assert final.materialized == chain.loaded == plan.loaded_tokens == plan.loads[0].tokens
    assert chain.first_token_s > 0.0
    _, cold_cache, _ = cold_prefill(model, prompt)
    for (k, v), (ck, cv) in zip(cache_layers(final.cache), cache_layers(cold_cache), strict=True):
        # the computed head is the cold computation; the loaded span is the donor's KV, not this context's
        assert torch.allclose(k[:, :, :head], ck[:, :, :head], atol=2e-2, rtol=0)
        assert torch.allclose(v[:, :, :head], cv[:, :, :head], atol=2e-2, rtol=0)
    deep = slice(plan.loads[0].start + 32, plan.loads[0].end)
    assert not torch.allclose(v[:, :, deep], cv[:, :, deep], atol=2e-2, rtol=0)  # the last layer's V: context differs


def test_a_chain_under_another_salt_does_not_meet_the_steps_blocks(model) -> None:
    engine, prompt, plan, donor_id = _setup(model)
    engine.run_chain(prompt, plan, {"d": donor_id}, tenant="t", nonce="r1")
    other = engine.run(prompt[: plan.step_prefixes[0] + BLOCK], cache_salt=isolating_salt("t", "r2"))
    assert other.device_matched == 0
    same = engine.run(prompt[: plan.step_prefixes[0] + BLOCK], cache_salt=isolating_salt("t", "r1"))
    assert same.device_matched >= plan.step_prefixes[0]


def test_chain_bench_runs_end_to_end_on_cpu(model) -> None:
    row = chain_bench.run_chain_ttft(
        model,
        length=LENGTH,
        share=0.85,
        wrapper=WRAPPER,
        repeats=1,
        block_size=BLOCK,
        vocab_size=TINY_LLAMA["vocab_size"],
        cuda_graphs=False,
    )
    assert row["steps"] == 1 and row["loaded_tokens"] == row["planned_tokens"] > 0.8 * LENGTH
    assert row["step_computed_tokens"] == [96]
    assert len(row["step_overhead_tokens"]) == 1 and row["chain_whole_ms"] > 0
    # every prompt token is computed by exactly one request of the chain or loaded from the donor
    assert row["final_computed_tokens"] + sum(row["step_computed_tokens"]) == row["computed_tokens"]
    assert row["computed_tokens"] + row["loaded_tokens"] == LENGTH
    assert len(row["step_bare_prefill_ms"]) == len(row["step_engine_overhead_ms"]) == 1
