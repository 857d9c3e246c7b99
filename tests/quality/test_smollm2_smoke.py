"""Smoke version of benchmarks/quality on the real SmolLM2-135M-Instruct (CPU, short prompts, a few items).

Exact mode must reproduce cold logits bit for bit (fp32); the negative control must materialize nothing; in shifted
mode (run with the gate open, then the default gate replayed on the plan) a leading-evidence recipient is accepted and
stays within the quality bar, and a reordered-RAG recipient (a 64-token span moved by 214 positions) is declined, and
would have changed the answer. A prefill chain serves an instruction-variant recipient (its own words before the
evidence) with donor KV loaded after a prefill-only step.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from benchmarks.quality import workload
from benchmarks.quality.evaluate import ItemEvaluator
from benchmarks.quality.modes import BLOCK_SIZE, MODES
from semblend_apps.reference_engine.smollm2 import ModelNotInstalled, load_smollm2


@pytest.fixture(scope="module")
def smollm2():
    import torch

    torch.set_num_threads(1)
    try:
        return load_smollm2()
    except ModelNotInstalled as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def rows(smollm2):
    tokenizer, model = smollm2

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    recs = list(workload.records([250, 300, 250], count))  # the first budget finds no entry to ask about: skipped
    plain = ["exact_repeat", "leading_evidence_new_task", "rag_reorder", "negative_control"]
    chained = ["instruction_variant", "negative_control"]
    items = workload.build(recs, [*plain, "instruction_variant"])[: len(plain) + 1]
    chain_modes = [m for m in MODES if m.startswith("chain_")]
    out = {}
    for modes, transforms in ((["exact", "shifted"], plain), (["shifted", *chain_modes], chained)):
        evaluator = ItemEvaluator(model, tokenizer, {m: MODES[m] for m in modes}, answer_tokens=16)  # as in quality.md
        for item in (i for i in items if i["transform"] in transforms):
            out.update({(r["transform"], r["mode"]): r for r in evaluator.rows(item)})
    return out


@pytest.mark.slow
def test_system_prompt_fills_whole_blocks(smollm2):
    tokenizer, _ = smollm2
    assert workload.system_prefix_tokens(tokenizer) == workload.SYSTEM_BLOCKS * BLOCK_SIZE


@pytest.mark.slow
def test_exact_mode_is_logit_identical_to_cold(rows):
    row = rows[("exact_repeat", "exact")]
    assert row["materialized"] == (row["prompt_tokens"] - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert row["plan_mode"] == "exact"
    assert row["max_abs_logit_diff"] == 0.0
    assert row["split_max_abs_logit_diff"] == 0.0
    assert row["mean_kl"] == 0.0 and row["greedy_exact_match"]


@pytest.mark.slow
def test_negative_control_materializes_nothing(rows):
    for mode in MODES:  # the chain modes too
        row = rows[("negative_control", mode)]
        assert row["materialized"] == 0
        assert row["declined"]  # a counted decline, not silence


@pytest.mark.slow
def test_gate_lets_a_leading_evidence_span_through_within_the_quality_bar(rows):
    assert rows[("leading_evidence_new_task", "exact")]["materialized"] == 0
    row = rows[("leading_evidence_new_task", "shifted")]
    assert row["plan_mode"] == "shifted" and row["materialized"] > 0
    start, _, delta = row["spans"][-1]
    assert start == workload.SYSTEM_BLOCKS * BLOCK_SIZE and delta < 0
    assert row["gate"] == "accepted"
    assert row["acceptable"] and row["mean_kl"] <= 0.05


@pytest.mark.slow
def test_gate_declines_a_short_far_moved_span_that_would_have_changed_the_answer(rows):
    row = rows[("rag_reorder", "shifted")]
    assert row["materialized"] > 0  # the gate was open for the run
    (_, _, exact_delta), (start, length, delta) = row["spans"]
    assert exact_delta == 0 and start == 64 and length == 64 and delta < -200
    assert row["gate"] == "deviation_too_high"
    assert not row["acceptable"]


@pytest.mark.slow
def test_a_prefill_chain_loads_the_evidence_behind_the_recipients_own_words(rows):
    assert rows[("instruction_variant", "shifted")]["materialized"] == 0  # a plain load cannot reach it
    loaded = {}
    for head in (0, 16, 64):
        row = rows[("instruction_variant", f"chain_h{head}")]
        assert row["chain_steps"] >= 1 and row["materialized"] == row["chain_loaded"] == row["chain_planned"] > 0
        assert row["mean_kl"] > 0.0  # approximate KV: the evidence now follows other words
        assert row["gate"] in ("accepted", "deviation_too_high")
        loaded[head] = row["materialized"]
    assert loaded[0] >= loaded[16] >= loaded[64]  # the recomputed head is not loaded
    assert rows[("negative_control", "chain_h16")]["materialized"] == 0
