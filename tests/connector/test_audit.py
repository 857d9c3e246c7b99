"""Audit JSONL: SemBench-compatible fields, and counts that match what the harness saw happen."""

from __future__ import annotations

from collections import Counter

from prometheus_client import REGISTRY

from semblend_dynamo.audit import AuditWriter, read_audit
from semblend_dynamo.events.schemas import DonorHint, request_key
from semblend_dynamo.outcomes import DeclineReason

from .conftest import prompt, records

SEMBENCH_FIELDS = {"event", "found", "materialized", "requires_rope_correction", "rejection_reason"}


def _metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_audit_file_parses_and_counts_match(make_harness, tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditWriter(path)
    exact_lineage = {"lineage": "exact"}
    materialized_before = _metric("semblend_connector_materialized_tokens_total", exact_lineage)
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
    assert _metric("semblend_connector_materialized_tokens_total", exact_lineage) - materialized_before == sum(
        r.promised for r in promised
    )
    assert set().union(*(rec.keys() for rec in lines)) >= SEMBENCH_FIELDS
    reasons = Counter(rec["rejection_reason"] for rec in lines if rec["event"] == "declined")
    assert reasons["no_candidate"] >= 3 and reasons["prompt_too_short"] == 1


def _hint(h, tokens: list[int], donor_id: str, **fields) -> DonorHint:
    return DonorHint(
        request_key=request_key(tokens),
        donor_id=donor_id,
        worker_id=0,
        namespace=h.scheduler.model.namespace().digest(),
        decision="semantic_placement",
        **fields,
    )


def test_donor_prefill_runs_cold_and_a_recipient_joins_the_router_on_trace_id(make_harness) -> None:
    h = make_harness()
    first = h.run_request(prompt(60, 96))
    donor = h.scheduler.registry.donor_id_for(first.request_id)
    second_donor = prompt(60, 64) + prompt(61, 40)  # shares 64 tokens with the first donor

    h.scheduler.hints.submit(_hint(h, second_donor, donor, role="donor_prefill", trace_id="seed-1"))
    prefill = h.run_request(second_donor)
    assert prefill.promised == 0 and prefill.pinned  # it could have loaded 64 tokens; a donor prefill loads none
    assert [(r.event, r.role, r.trace_id) for r in records(h, request_id=prefill.request_id)] == [
        ("donor_registered", "donor_prefill", "seed-1")
    ]

    h.scheduler.hints.submit(_hint(h, second_donor, donor, similarity=0.83, trace_id="route-7"))
    recipient = h.run_request(second_donor)  # the same prompt as a recipient does load
    assert recipient.promised == 64
    mine = records(h, request_id=recipient.request_id)
    assert [r.event for r in mine][:3] == ["lookup", "promised", "materialized"]
    assert {(r.role, r.trace_id) for r in mine} == {("recipient", "route-7")}
    assert mine[0].similarity == 0.83 and mine[0].found is True
    assert mine[1].num_new_matched_tokens == mine[2].materialized == 64


def test_a_request_without_a_hint_gets_its_own_trace_id(make_harness) -> None:
    h = make_harness()
    a, b = h.run_request(prompt(70, 40)), h.run_request(prompt(71, 40))
    traces = [{r.trace_id for r in records(h, request_id=x.request_id)} for x in (a, b)]
    assert all(len(t) == 1 and None not in t for t in traces) and traces[0] != traces[1]


def test_decision_records_keep_their_fields_in_order(make_harness, tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    h = make_harness(audit=AuditWriter(path))
    donor = prompt(120, 100)
    h.run_request(donor)
    h.run_request(donor[:64] + prompt(121, 20))
    h.run_request(prompt(122, 100))
    h.scheduler.audit.close()
    head = ["event", "ts", "run_id", "role", "trace_id", "request_id"]
    expected = {
        ("lookup", True): [*head, "donor_id", "worker_id", "namespace", "found", "mode"],
        ("lookup", False): [*head, "worker_id", "namespace", "found", "mode"],
        ("promised", None): [
            *head,
            *("donor_id", "worker_id", "namespace", "num_new_matched_tokens", "requires_rope_correction", "tokens"),
            *("blocks", "delta", "mode", "lineage", "latency_us"),
        ],
        ("declined", None): [
            *head,
            *("worker_id", "namespace", "outcome", "requires_rope_correction", "rejection_reason", "mode"),
            *("latency_us", "detail"),
        ],
    }
    seen = {
        (rec["event"], rec.get("found")): list(rec) for rec in read_audit(path) if rec["event"] != "donor_registered"
    }
    assert {k: v for k, v in seen.items() if k in expected} == expected
