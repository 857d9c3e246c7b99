"""SemBench in and out: a SemBench manifest replayed through the connector harness, and our audit counted the way
SemBench's TensorRT-LLM parser counts it, against our own report of the same run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from semblend_apps.cli import main
from semblend_dynamo.audit import read_audit
from tests.support.sembench_fixture import FIXTURE_PATH
from tests.support.sembench_parser import parse_trtllm_audit

SHIFTED = ("--exact-materialization-only", "0", "--isolation", "cache_salt")
CHAIN = (*SHIFTED, "--chain-enabled", "1")
TRANSFORMS = {
    "exact_repeat",
    "same_evidence_new_task",
    "leading_evidence_new_task",
    "instruction_variant",
    "rag_reorder",
    "multi_donor_composite",
    "fuzzy_edit",
    "negative_control",
}


def replay_manifest(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[dict[str, Any], Path]:
    audit = tmp_path / "audit.jsonl"
    argv = ["replay", "--json", "--requests", "--embedder", "hash", "--audit-path", str(audit)]
    assert main([*argv, "--manifest", str(FIXTURE_PATH), "--sembench-results", str(tmp_path / "res.json"), *args]) == 0
    data = json.loads(capsys.readouterr().out)
    return data, Path(data["audit_path"])  # this run's file, beside --audit-path


@pytest.mark.parametrize("mode", [(), SHIFTED, CHAIN], ids=["exact", "shifted", "chain"])
def test_sembench_parse_of_our_audit_counts_what_our_report_counts(capsys, tmp_path, mode) -> None:
    data, audit = replay_manifest(capsys, tmp_path, *mode)
    counts = parse_trtllm_audit(audit)
    by_transform = data["by_transform"]
    assert set(by_transform) == TRANSFORMS
    materialized = [r for r in data["requests"] if r["replay_class"] == "materialized"]
    assert materialized, "the fixture must materialize in every mode"
    assert counts.errors == []
    assert counts.materialization_events == data["outcomes"]["materialized"] == len(materialized)
    assert counts.materialization_events == sum(t["materialized"] for t in by_transform.values())
    assert (
        counts.materialized_units
        == data["reused_tokens"]
        == sum(t["materialized_tokens"] for t in by_transform.values())
    )
    assert counts.materialized_semantic_kv_reuse
    assert by_transform["negative_control"]["false_positives"] == 0

    records = read_audit(audit)
    # donor prefills ran through the connector (and one had an earlier donor to load from) but loaded nothing
    prefills = [r for r in records if r.get("role") == "donor_prefill"]
    assert {r["event"] for r in prefills} == {"donor_registered"}
    assert (
        len(prefills)
        == data["workload"]["donors"]
        == counts.donor_registrations
        - sum(r["event"] == "donor_registered" and r.get("role") == "recipient" for r in records)
    )
    # every request-scoped record says which run, whose, and which request; router and connector join on trace_id
    scoped = [r for r in records if r.get("request_id") is not None]
    assert all(r["run_id"] and r["role"] and r["trace_id"] for r in scoped)
    connector_traces = {r["trace_id"] for r in records if "component" not in r}
    for request in data["requests"]:
        reached_connector = request["replay_class"] in ("materialized", "backend_declined")
        assert (request["trace_id"] in connector_traces) == reached_connector, request["request_id"]
    for rec in records:
        if rec["event"] == "materialized":
            assert rec["role"] == "recipient"
            [promise] = [r for r in records if r["event"] == "promised" and r["trace_id"] == rec["trace_id"]]
            assert promise["num_new_matched_tokens"] == rec["materialized"]
    assert counts.rope_corrections == sum(r["event"] == "materialized" and r["delta"] != 0 for r in records)
    if mode:
        assert counts.rope_corrections >= 1
        assert by_transform["leading_evidence_new_task"]["materialized"] == 1

    # the results document, in SemBench's schema, carries the same numbers
    results = json.loads((tmp_path / "res.json").read_text())
    assert results["result_version"] == "sembench.result.v2" and results["paired"] is None
    assert len(results["requests"]) == data["workload"]["requests"]
    assert results["aggregate"]["external_confirmed_tokens"] == counts.materialized_units
    assert sum(r["audit_materialized"] for r in results["requests"]) == counts.materialization_events
    assert results["run"]["manifest_sha256"] == data["workload"]["manifest_sha256"]
    assert set(results["by_transform"]) == TRANSFORMS


def test_by_transform_rows_add_up(capsys, tmp_path) -> None:
    data, _ = replay_manifest(capsys, tmp_path)
    outcomes: Counter[str] = Counter()
    for name, row in data["by_transform"].items():
        declined = sum(row["declined"].values())
        assert row["requests"] == row["exact"] + row["placement"] + row["materialized"] + declined + row["cold"], name
        assert row["materialized_tokens"] <= row["donor_covered_tokens"] <= row["prompt_tokens"], name
        outcomes["requests"] += row["requests"]
    assert outcomes["requests"] == data["workload"]["requests"]
    assert data["missing_classes"] == []  # a manifest promises no classes
    # repeated and re-tasked evidence is covered by donors; the negative controls' documents are not
    assert data["by_transform"]["exact_repeat"]["donor_covered_tokens"] > 0
    assert data["by_transform"]["negative_control"]["donor_covered_tokens"] == 0


def test_a_prefill_chain_reaches_evidence_behind_the_recipients_own_words(capsys, tmp_path) -> None:
    plain, _ = replay_manifest(capsys, tmp_path / "plain", *SHIFTED)
    chained, audit = replay_manifest(capsys, tmp_path / "chain", *CHAIN)
    before, after = plain["by_transform"]["instruction_variant"], chained["by_transform"]["instruction_variant"]
    assert before["materialized"] == 0 and before["declined"] == {"not_prefix_contiguous": before["requests"]}
    assert after["materialized"] == after["requests"] and after["chain_steps"] >= after["requests"]
    assert after["materialized_tokens"] >= 0.8 * after["donor_covered_tokens"]
    assert chained["by_transform"]["negative_control"]["false_positives"] == 0
    records = read_audit(audit)
    chained_ids = {r["request_id"] for r in chained["requests"] if r["chain_steps"]}
    traces = {r["trace_id"] for r in chained["requests"] if r["request_id"] in chained_ids}
    steps = [r for r in records if r.get("role") == "chain_step"]
    assert {r["trace_id"] for r in steps} <= traces  # steps are audited under their recipient's trace
    assert not [r for r in steps if r["event"] == "materialized"]  # a step's load is never counted as reuse
    loads = [r for r in records if r["event"] == "materialized" and r["trace_id"] in traces]
    assert loads and all(r["lineage"] == "approximate" and r["requires_rope_correction"] for r in loads)


def test_reach_counts_every_token_served_from_donor_kv(capsys, tmp_path) -> None:
    data, audit = replay_manifest(capsys, tmp_path, *CHAIN, "--chain-step-overhead-tokens", "0")
    records = read_audit(audit)
    by_id = {r["request_id"]: r for r in data["requests"]}
    served = 0
    for name, row in data["by_transform"].items():
        exact = sum(
            r["exact_prefix_tokens"]
            for r in data["requests"]
            if r["transform"] == name and r["replay_class"] == "exact"
        )
        assert row["served_tokens"] == exact + row["materialized_tokens"] + row["chain_step_tokens"], name
        assert row["served_tokens"] <= row["donor_covered_tokens"] or name == "negative_control", name
        if name != "negative_control":
            served += row["served_tokens"]
    loads = sum(r["materialized"] for r in records if r["event"] in ("materialized", "chain_step_loaded"))
    exact_total = sum(r["exact_prefix_tokens"] for r in by_id.values() if r["replay_class"] == "exact")
    assert served == loads + exact_total  # the audit's loads plus the engine's own prefix hits
    reach = data["reach"]
    assert reach["served_tokens"] == served and "negative_control" not in reach["transforms"]
    covered = sum(t["donor_covered_tokens"] for n, t in data["by_transform"].items() if n in reach["transforms"])
    assert reach["donor_covered_tokens"] == covered and reach["share"] == round(served / covered, 4)
    assert reach["negative_control_false_positives"] == 0


def test_chain_steps_load_spans_and_are_audited_as_chain_steps(capsys, tmp_path) -> None:
    # the deviation gate open: reordered chunks chain (the default gate declines them, see the next test)
    free = ("--chain-step-overhead-tokens", "0", "--chain-max-deviation", "1")
    data, audit = replay_manifest(capsys, tmp_path, *CHAIN, *free)
    rag = data["by_transform"]["rag_reorder"]
    assert rag["materialized"] == rag["requests"] and rag["chain_step_tokens"] > 0
    steps = [r for r in read_audit(audit) if r["event"] == "chain_step_loaded"]
    assert sum(r["materialized"] for r in steps) == sum(t["chain_step_tokens"] for t in data["by_transform"].values())
    assert all(r["role"] == "chain_step" for r in steps)
    assert all(r["lineage"] == "approximate" for r in steps if r["delta"])  # a shifted load is never exact
    # every chain request's KV is approximate: none of them became a donor (replay unpins targets) or an exact one
    assert not [r for r in read_audit(audit) if r["event"] == "donor_registered" and r.get("role") == "chain_step"]


def test_the_default_chain_gate_declines_reordered_chunks_and_keeps_a_wrapped_span(capsys, tmp_path) -> None:
    data, _ = replay_manifest(capsys, tmp_path, *CHAIN, "--chain-step-overhead-tokens", "0")
    rows = data["by_transform"]
    assert rows["rag_reorder"]["materialized"] == 0 and rows["rag_reorder"]["chain_steps"] == 0
    assert rows["instruction_variant"]["materialized"] == rows["instruction_variant"]["requests"]
    assert rows["instruction_variant"]["chain_steps"] >= rows["instruction_variant"]["requests"]
