"""Audit lines are byte for byte what the pydantic ``AuditRecord`` wrote (SemBench's parser reads them).

The record became a plain slotted class (two are written per connector decision); the pydantic model it replaced is
kept here as the oracle, and both must accept and refuse the same values and serialize them to the same bytes.
"""

from __future__ import annotations

import math
import tempfile
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from semblend_dynamo.audit import RUN_ID, AuditEvent, AuditRecord, AuditWriter, Role, read_audit
from semblend_dynamo.outcomes import DeclineReason, Outcome


class PydanticAuditRecord(BaseModel):
    """The model as it was (semblend_dynamo/audit.py before issue 16.2)."""

    model_config = ConfigDict(extra="forbid", use_enum_values=True)

    event: AuditEvent
    ts: float
    run_id: str = RUN_ID
    role: Role | None = None
    trace_id: str | None = None
    request_id: str | None = None
    donor_id: str | None = None
    worker_id: str | None = None
    namespace: str | None = None
    component: str | None = None
    outcome: Outcome | None = None
    found: bool | None = None
    similarity: float | None = None
    num_new_matched_tokens: int | None = Field(None, ge=0)
    materialized: int | None = Field(None, ge=0)
    requires_rope_correction: bool | None = None
    rejection_reason: DeclineReason | None = None
    tokens: int | None = Field(None, ge=0)
    blocks: int | None = Field(None, ge=0)
    delta: int | None = None
    mode: str | None = None
    lineage: str | None = None
    latency_us: float | None = Field(None, ge=0)
    detail: str | None = None

    @model_validator(mode="after")
    def _only_recipients_materialize(self) -> PydanticAuditRecord:
        if self.event == AuditEvent.MATERIALIZED.value and self.role != Role.RECIPIENT.value:
            raise ValueError("recipient")
        return self


def enum_values(kind: type[Enum]) -> st.SearchStrategy[Any]:
    return st.sampled_from(list(kind)) | st.sampled_from([m.value for m in kind])


TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["", "0:7", 'a"b\\c\n\t\x00\x7f']
)
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-5, 1e-7, 1e16, 123.456, 1e-4])
COUNTS = st.integers(-3, 2**40)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "role": enum_values(Role),
    "trace_id": TEXT,
    "request_id": TEXT | st.integers(0, 9),  # an int is refused by both
    "donor_id": TEXT,
    "worker_id": TEXT,
    "namespace": TEXT,
    "component": TEXT,
    "outcome": enum_values(Outcome),
    "found": st.booleans(),
    "similarity": FLOATS | st.integers(-5, 5),
    "num_new_matched_tokens": COUNTS,
    "materialized": COUNTS,
    "requires_rope_correction": st.booleans(),
    "rejection_reason": enum_values(DeclineReason) | st.just("no_such_reason"),
    "tokens": COUNTS,
    "blocks": COUNTS,
    "delta": st.integers(-(2**40), 2**40),
    "mode": st.sampled_from(["exact", "shifted"]),
    "lineage": st.sampled_from(["exact", "approximate"]),
    "latency_us": FLOATS | st.integers(-2, 10**6),
    "detail": TEXT,
}


@settings(max_examples=400, deadline=None)
@given(
    event=enum_values(AuditEvent) | st.just("not_an_event"),
    ts=FLOATS.filter(math.isfinite) | st.integers(0, 2**40),
    fields=st.fixed_dictionaries({}, optional=FIELDS),
)
def test_same_bytes_and_same_refusals_as_the_pydantic_record(event: Any, ts: Any, fields: dict[str, Any]) -> None:
    try:
        expected: str | None = PydanticAuditRecord(event=event, ts=ts, **fields).model_dump_json(exclude_none=True)
    except ValidationError:
        expected = None
    if expected is None:
        with pytest.raises(ValidationError):
            AuditRecord(event=event, ts=ts, **fields)
    else:
        record = AuditRecord(event=event, ts=ts, **fields)
        assert record.to_json() == expected
        with tempfile.TemporaryDirectory() as tmp:  # and the writer's line is those bytes
            with AuditWriter(Path(tmp) / "audit.jsonl") as writer:
                writer.write(record)
            assert (Path(tmp) / "audit.jsonl").read_bytes() == expected.encode() + b"\n"


def test_held_lines_go_out_with_the_next_write(tmp_path) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    records = [writer.write(flush=False, event=AuditEvent.LOOKUP, request_id="r1", found=True)]
    assert path.read_text() == ""  # still in the buffer: the verdict's write sends it
    records.append(
        writer.write(
            event=AuditEvent.DECLINED, request_id="r1", rejection_reason=DeclineReason.NO_CANDIDATE, detail="é"
        )
    )
    assert [r["event"] for r in read_audit(path)] == ["lookup", "declined"]
    records.append(writer.write(flush=False, event=AuditEvent.LOOKUP, request_id="r2", found=False))
    writer.flush()
    assert [r["request_id"] for r in read_audit(path)] == ["r1", "r1", "r2"]
    assert path.read_bytes() == "".join(r.to_json() + "\n" for r in records).encode()  # the lines, byte for byte
    assert writer.by_event == {"lookup": 2, "declined": 1} and writer.by_reason == {"no_candidate": 1}
    writer.close()
