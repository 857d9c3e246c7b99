from __future__ import annotations

import pytest
from pydantic import ValidationError

from semblend_dynamo.audit import RUN_ID, AuditEvent, AuditRecord, AuditWriter, Role, read_audit
from semblend_dynamo.outcomes import DeclineReason


def test_audit_lines_flushed_per_record_and_counted(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    writer.write(event=AuditEvent.LOOKUP, request_id="r1", found=True)
    # flushed before close: a reader sees it now
    assert read_audit(path)[0]["found"] is True
    writer.write(event=AuditEvent.DECLINED, request_id="r1", rejection_reason=DeclineReason.DONOR_EVICTED)
    writer.write(
        event=AuditEvent.MATERIALIZED,
        role=Role.RECIPIENT,
        trace_id="t2",
        request_id="r2",
        materialized=64,
        requires_rope_correction=False,
    )
    writer.close()
    recs = read_audit(path)
    assert [r["event"] for r in recs] == ["lookup", "declined", "materialized"]
    assert recs[1]["rejection_reason"] == "donor_evicted"
    assert "materialized" not in recs[0]  # unset fields are omitted
    assert writer.by_event == {"lookup": 1, "declined": 1, "materialized": 1}
    assert writer.by_reason == {"donor_evicted": 1}


def test_partial_last_line_is_skipped(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditWriter(path) as w:
        w.write(event=AuditEvent.LOOKUP, found=False)
    with open(path, "a") as f:
        f.write('{"event": "materia')
    assert len(read_audit(path)) == 1


def test_every_record_names_its_run_and_requests_their_role_and_trace(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditWriter(path) as w:
        w.write(event=AuditEvent.DONOR_REGISTERED, role=Role.DONOR_PREFILL, trace_id="t1", request_id="7")
        w.write(
            event=AuditEvent.PROMISED, role=Role.RECIPIENT, trace_id="t2", request_id="8", num_new_matched_tokens=64
        )
        w.write(event=AuditEvent.LOOKUP, role=Role.RECIPIENT, trace_id="t2", request_id="8", found=True, similarity=0.9)
    recs = read_audit(path)
    assert {r["run_id"] for r in recs} == {RUN_ID} and len(RUN_ID) == 16
    assert [r["role"] for r in recs] == ["donor_prefill", "recipient", "recipient"]
    assert recs[1]["num_new_matched_tokens"] == 64 and recs[2]["similarity"] == 0.9


@pytest.mark.parametrize("role", [None, Role.DONOR_PREFILL, Role.CHAIN_STEP])
def test_only_a_recipient_may_write_materialized(role) -> None:
    with pytest.raises(ValidationError, match="recipient"):
        AuditRecord(event=AuditEvent.MATERIALIZED, role=role, materialized=32)
