from __future__ import annotations

from semblend_dynamo.audit import AuditEvent, AuditWriter, read_audit
from semblend_dynamo.outcomes import DeclineReason


def test_audit_lines_flushed_per_record_and_counted(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    writer.write(event=AuditEvent.LOOKUP, request_id="r1", found=True)
    # flushed before close: a reader sees it now
    assert read_audit(path)[0]["found"] is True
    writer.write(event=AuditEvent.DECLINED, request_id="r1", rejection_reason=DeclineReason.DONOR_EVICTED)
    writer.write(event=AuditEvent.MATERIALIZED, request_id="r2", materialized=64, requires_rope_correction=False)
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
