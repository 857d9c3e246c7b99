"""Audit records: JSON lines, one object per event, flushed per record (the contract: docs/sembench.md).

Field names are compatible with SemBench's TensorRT-LLM audit parser (``event``, ``found``,
``materialized``, ``requires_rope_correction``, ``rejection_reason``) plus our own. Every record carries the
process's ``run_id``; request-scoped records also say whose they are (``role``) and which request they belong
to across router and connector (``trace_id``). Only a recipient's load is a ``materialized`` record (the model
refuses any other), so a parser that counts ``materialized`` events counts exactly the reuse we report.

Every component writes through :class:`AuditWriter`, so a record is on disk (or in the in-memory sink) before
the call that produced it returns: a clean shutdown loses nothing, a crash at most a partial last line.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from enum import Enum
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .config import SemblendConfig
from .outcomes import DeclineReason, Outcome

RUN_ID = uuid.uuid4().hex[:16]
"""One id per process start, stamped on every record this process writes."""


class AuditEvent(str, Enum):
    """The ``event`` field."""

    DONOR_REGISTERED = "donor_registered"
    LOOKUP = "lookup"
    PROMISED = "promised"
    MATERIALIZED = "materialized"
    CHAIN_STEP_LOADED = "chain_step_loaded"  # a prefill-chain step's load: not counted as reuse on its own
    DECLINED = "declined"
    DONOR_RELEASED = "donor_released"
    ROUTED = "routed"


class Role(str, Enum):
    """Whose request a record is about (``role``)."""

    RECIPIENT = "recipient"  # a request served to a client: the only role whose loads are reuse
    DONOR_PREFILL = "donor_prefill"  # a prefill run only to make a donor; it never loads donor KV
    CHAIN_STEP = "chain_step"  # one step of a prefill chain; its loads are not a client's reuse


class AuditRecord(BaseModel):
    """One audit line. Unset optional fields are omitted from the JSON."""

    model_config = ConfigDict(extra="forbid", use_enum_values=True)

    event: AuditEvent
    ts: float = Field(default_factory=time.time)
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
    similarity: float | None = Field(None, description="best embedding similarity (on `lookup`)")
    num_new_matched_tokens: int | None = Field(None, ge=0, description="tokens promised (on `promised`)")
    materialized: int | None = Field(None, ge=0, description="tokens materialized (on `materialized`)")
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
    def _only_recipients_materialize(self) -> AuditRecord:
        if self.event == AuditEvent.MATERIALIZED.value and self.role != Role.RECIPIENT.value:
            raise ValueError(f"`materialized` is a recipient's reuse: role {self.role!r} may not write it")
        return self

    def to_json(self) -> str:
        # pydantic's own serializer: a third of model_dump + json.dumps, and audit writes are on the decision path
        return self.model_dump_json(exclude_none=True)


class AuditWriter:
    """Thread-safe append-only JSONL writer (or in-memory sink when ``path`` is None).

    Counts records by event and by decline reason so components can expose them as metrics and tests
    can check that counts match what happened.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, fsync: bool = False) -> None:
        self._lock = threading.Lock()
        self._fsync = fsync
        self._file: IO[str] | None = None
        self.path = Path(path) if path is not None else None
        self.records: list[AuditRecord] | None = None if path is not None else []
        self.by_event: Counter[str] = Counter()
        self.by_reason: Counter[str] = Counter()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the writer

    def write(self, record: AuditRecord | None = None, /, **fields: Any) -> AuditRecord:
        """Append one record (built from ``fields`` when ``record`` is None) and flush it."""
        rec = record if record is not None else AuditRecord(**fields)
        line = rec.to_json()
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()
                if self._fsync:
                    os.fsync(self._file.fileno())
            elif self.records is not None:
                self.records.append(rec)
            self.by_event[str(rec.event)] += 1
            if rec.rejection_reason is not None:
                self.by_reason[str(rec.rejection_reason)] += 1
        return rec

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                self._file.close()
                self._file = None

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_audit_path(path: str | os.PathLike[str], *, append: bool) -> Path:
    """The file this run writes: ``path`` itself when appending, else ``path`` with the run id before its suffix.

    ``audit.jsonl`` -> ``audit.<run_id>.jsonl``: runs never mix in one file and a restart never appends to an earlier
    run's file; every process of one run (e.g. replay and its connector backend) resolves the same name.
    """
    p = Path(path)
    return p if append else p.with_name(f"{p.stem}.{RUN_ID}{p.suffix}")


def audit_file(cfg: SemblendConfig) -> str | None:
    """The audit file of a component configured by ``cfg`` (None: in memory), see :func:`run_audit_path`."""
    return None if cfg.audit_path is None else str(run_audit_path(cfg.audit_path, append=cfg.audit_append))


def read_audit(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse an audit file; a partial last line (crash) is skipped."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
