from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from semblend_dynamo.audit import (
    RUN_ID,
    AuditEvent,
    AuditRecord,
    AuditWriter,
    Role,
    audit_file,
    new_trace_id,
    read_audit,
    run_audit_path,
)
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.outcomes import DeclineReason


def test_a_short_write_sends_the_rest_in_order(tmp_path, monkeypatch) -> None:
    """The OS may take part of a line per call: the writer sends the rest, whole lines in order, nothing twice."""
    import semblend_dynamo.audit as audit_module

    real_write = os.write
    calls: list[int] = []

    def short_write(fd: int, data: bytes) -> int:  # at most 7 bytes a call
        calls.append(len(data))
        return real_write(fd, bytes(data[:7]))

    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    monkeypatch.setattr(audit_module.os, "write", short_write)
    writer.write(event=AuditEvent.LOOKUP, request_id="r1", found=True, flush=False)
    writer.write(event=AuditEvent.DECLINED, request_id="r1", rejection_reason=DeclineReason.DONOR_EVICTED)
    monkeypatch.setattr(audit_module.os, "write", real_write)
    writer.close()
    assert len(calls) > 2
    assert [(r["event"], r["request_id"]) for r in read_audit(path)] == [("lookup", "r1"), ("declined", "r1")]
    assert path.read_bytes().count(b"\n") == 2


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


def test_each_run_writes_its_own_file_unless_appending(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    run_file = run_audit_path(path, append=False)
    assert run_file == tmp_path / f"audit.{RUN_ID}.jsonl"
    assert run_audit_path(path, append=True) == path
    cfg = SemblendConfig(audit_path=str(path))
    assert audit_file(cfg) == str(run_file)
    assert audit_file(cfg.model_copy(update={"audit_append": True})) == str(path)
    assert audit_file(SemblendConfig()) is None  # in memory


def test_replay_runs_never_share_an_audit_file_unless_appending(tmp_path) -> None:
    """Two replay processes with one --audit-path: two files; with --audit-append 1: one file with both runs."""
    script = "from semblend_apps.cli import main; raise SystemExit(main())"
    path = tmp_path / "audit.jsonl"
    args = ["replay", "--backend", "none", "--embedder", "hash", "--units", "1", "--audit-path", str(path)]
    for extra in ([], [], ["--audit-append", "1"], ["--audit-append", "1"]):
        subprocess.run([sys.executable, "-c", script, *args, *extra], check=True, capture_output=True)
    per_run = sorted(tmp_path.glob("audit.*.jsonl"))
    assert len(per_run) == 2
    run_ids = [{r["run_id"] for r in read_audit(p)} for p in per_run]
    assert all(len(ids) == 1 for ids in run_ids) and run_ids[0] != run_ids[1]
    appended = {r["run_id"] for r in read_audit(path)}
    assert len(appended) == 2 and not appended & (run_ids[0] | run_ids[1])


def test_trace_ids_are_random_hex_and_never_repeat_across_refills() -> None:
    ids = [new_trace_id() for _ in range(3000)]  # several refills of the pool
    assert all(len(t) == 16 and int(t, 16) >= 0 and t == t.lower() for t in ids)
    assert len(set(ids)) == len(ids)


def test_trace_ids_do_not_follow_the_global_random_seed() -> None:
    import random

    random.seed(1234)
    first = [new_trace_id() for _ in range(200)]
    random.seed(1234)  # an application seeding `random` must not make two processes' trace ids repeat
    again = [new_trace_id() for _ in range(200)]
    assert not set(first) & set(again)


def test_a_forked_child_never_draws_the_trace_ids_its_parent_will_draw() -> None:
    new_trace_id()  # the pool holds ids drawn before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, ",".join(new_trace_id() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read().split(",")
    os.waitpid(pid, 0)
    parent = [new_trace_id() for _ in range(8)]
    assert len(child) == 8 and not set(child) & set(parent)
