"""Audit JSONL: SemBench-compatible fields, and counts that match what the harness saw happen."""

from __future__ import annotations

from collections import Counter

from prometheus_client import REGISTRY

from semblend_dynamo.audit import AuditWriter, read_audit
from semblend_dynamo.outcomes import DeclineReason

from .conftest import prompt

SEMBENCH_FIELDS = {"event", "found", "materialized", "requires_rope_correction", "rejection_reason"}


def _metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_audit_file_parses_and_counts_match(make_harness, tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path)
    materialized_before = _metric("semblend_connector_materialized_tokens_total")
    h = make_harness(audit=audit, num_blocks=128, pin_budget_fraction=0.3)
    donors = [prompt(70 + i, 100) for i in range(3)]
    results = [h.run_request(d) for d in donors]
    results += [h.run_request(d[:64] + prompt(80 + i, 20)) for i, d in enumerate(donors)]
    results += [h.run_request(donors[0][:64] + prompt(90, 20), cache_salt="other|1")]
    results += [h.run_request(prompt(91, 5))]
    for _ in range(3):
        results.append(h.run_request(prompt(92 + len(results), 100)))
    audit.close()

    lines = read_audit(path)
    assert len(lines) == sum(1 for _ in path.open())
    by_event = Counter(rec["event"] for rec in lines)
    promised = [r for r in results if r.promised]
    assert by_event["lookup"] == len(results)
    assert by_event["promised"] == by_event["materialized"] == len(promised)
    assert by_event["declined"] == len(results) - len(promised)
    assert by_event["donor_registered"] == sum(r.pinned for r in results)
    assert by_event["donor_released"] == sum(len(r.released_donors) for r in results) + len(
        h.scheduler.registry._pending_release
    )
    for rec in lines:
        assert isinstance(rec["ts"], float) and rec["worker_id"] == "0"
        if rec["event"] == "lookup":
            assert isinstance(rec["found"], bool)
        if rec["event"] == "materialized":
            assert rec["materialized"] > 0 and rec["requires_rope_correction"] is False
            assert rec["outcome"] == "backend_materialized" and rec["latency_us"] >= 0
        if rec["event"] == "declined":
            assert rec["rejection_reason"] in {r.value for r in DeclineReason}
            assert rec["outcome"] == "backend_declined"
    assert sum(rec.get("materialized", 0) for rec in lines) == sum(r.promised for r in promised)
    assert _metric("semblend_connector_materialized_tokens_total") - materialized_before == sum(
        r.promised for r in promised
    )
    assert set().union(*(rec.keys() for rec in lines)) >= SEMBENCH_FIELDS
    reasons = Counter(rec["rejection_reason"] for rec in lines if rec["event"] == "declined")
    assert reasons["no_candidate"] >= 3 and reasons["prompt_too_short"] == 1
