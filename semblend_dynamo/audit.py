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

import contextlib
import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError, to_json

from .config import SemblendConfig
from .outcomes import DeclineReason, Outcome

RUN_ID = uuid.uuid4().hex[:16]
"""One id per process start, stamped on every record this process writes."""


_trace_rng = random.Random()  # its own generator: an application seeding `random` must not repeat our ids


def new_trace_id() -> str:
    """A fresh ``trace_id``: 16 random hex digits (64 bits from a generator seeded from ``os.urandom``).

    A correlation id, not a secret, so not one system call per id. It is also not drawn ahead in batches: a batch of
    128 ``os.urandom`` ids cost ~33 µs on the development VM, paid by one scheduler decision in 128, which put it
    among the slowest 1% every time. A forked child reseeds the generator, so it never draws the ids its parent will.
    """
    return f"{_trace_rng.getrandbits(64):016x}"


os.register_at_fork(after_in_child=_trace_rng.seed)


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


_FIELDS = (
    "event",
    "ts",
    "run_id",
    "role",
    "trace_id",
    "request_id",
    "donor_id",
    "worker_id",
    "namespace",
    "component",
    "outcome",
    "found",
    "similarity",
    "num_new_matched_tokens",
    "materialized",
    "requires_rope_correction",
    "rejection_reason",
    "tokens",
    "blocks",
    "delta",
    "mode",
    "lineage",
    "latency_us",
    "detail",
)


class AuditRecord:
    """One audit line: the fields in this order, unset (None) ones omitted from the JSON.

    A plain class, not a pydantic model: the connector writes two per scheduler decision. Values are checked as the
    model did (an invalid one raises pydantic's ``ValidationError``): enums are stored as their values, numbers keep
    their kind (an integral float is an int, an int a float where a float is due), counts and latency are ``>= 0``;
    text and flags must be strings and booleans (numeric strings are not parsed). The instance holds only the fields
    set, in this order (the class gives None for the others): its ``__dict__`` is the JSON object, serialized as it
    is. Records are not changed after they are made.
    """

    event: str
    ts: float
    run_id: str
    role: str | None = None
    trace_id: str | None = None
    request_id: str | None = None
    donor_id: str | None = None
    worker_id: str | None = None
    namespace: str | None = None
    component: str | None = None
    outcome: str | None = None
    found: bool | None = None
    similarity: float | None = None
    num_new_matched_tokens: int | None = None
    materialized: int | None = None
    requires_rope_correction: bool | None = None
    rejection_reason: str | None = None
    tokens: int | None = None
    blocks: int | None = None
    delta: int | None = None
    mode: str | None = None
    lineage: str | None = None
    latency_us: float | None = None
    detail: str | None = None

    def __init__(
        self,
        *,
        event: AuditEvent | str,
        ts: float | None = None,
        run_id: str = RUN_ID,
        role: Role | str | None = None,
        trace_id: str | None = None,
        request_id: str | None = None,
        donor_id: str | None = None,
        worker_id: str | None = None,
        namespace: str | None = None,
        component: str | None = None,
        outcome: Outcome | str | None = None,
        found: bool | None = None,
        similarity: float | None = None,
        num_new_matched_tokens: int | None = None,
        materialized: int | None = None,
        requires_rope_correction: bool | None = None,
        rejection_reason: DeclineReason | str | None = None,
        tokens: int | None = None,
        blocks: int | None = None,
        delta: int | None = None,
        mode: str | None = None,
        lineage: str | None = None,
        latency_us: float | None = None,
        detail: str | None = None,
    ) -> None:
        # Each value of the expected type is taken as it is; anything else goes through its check (or is refused).
        # Stored straight into the instance dict, in field order, only when set.
        values = self.__dict__
        values["event"] = _EVENTS.get(event) or _member(AuditEvent, "event", event)
        values["ts"] = time.time() if ts is None else ts if type(ts) is float else _real("ts", ts)
        values["run_id"] = run_id if type(run_id) is str else _text("run_id", run_id)
        if role is not None:
            values["role"] = _ROLES.get(role) or _member(Role, "role", role)
        if trace_id is not None:
            values["trace_id"] = trace_id if type(trace_id) is str else _text("trace_id", trace_id)
        if request_id is not None:
            values["request_id"] = request_id if type(request_id) is str else _text("request_id", request_id)
        if donor_id is not None:
            values["donor_id"] = donor_id if type(donor_id) is str else _text("donor_id", donor_id)
        if worker_id is not None:
            values["worker_id"] = worker_id if type(worker_id) is str else _text("worker_id", worker_id)
        if namespace is not None:
            values["namespace"] = namespace if type(namespace) is str else _text("namespace", namespace)
        if component is not None:
            values["component"] = component if type(component) is str else _text("component", component)
        if outcome is not None:
            values["outcome"] = _OUTCOMES.get(outcome) or _member(Outcome, "outcome", outcome)
        if found is not None:
            values["found"] = found if type(found) is bool else _flag("found", found)
        if similarity is not None:
            values["similarity"] = similarity if type(similarity) is float else _real("similarity", similarity)
        if num_new_matched_tokens is not None:
            values["num_new_matched_tokens"] = _count_of("num_new_matched_tokens", num_new_matched_tokens)
        if materialized is not None:
            values["materialized"] = _count_of("materialized", materialized)
        if requires_rope_correction is not None:
            values["requires_rope_correction"] = (
                requires_rope_correction
                if type(requires_rope_correction) is bool
                else _flag("requires_rope_correction", requires_rope_correction)
            )
        if rejection_reason is not None:
            values["rejection_reason"] = _REASONS.get(rejection_reason) or _member(
                DeclineReason, "rejection_reason", rejection_reason
            )
        if tokens is not None:
            values["tokens"] = _count_of("tokens", tokens)
        if blocks is not None:
            values["blocks"] = _count_of("blocks", blocks)
        if delta is not None:
            values["delta"] = delta if type(delta) is int else _integer("delta", delta)
        if mode is not None:
            values["mode"] = mode if type(mode) is str else _text("mode", mode)
        if lineage is not None:
            values["lineage"] = lineage if type(lineage) is str else _text("lineage", lineage)
        if latency_us is not None:
            values["latency_us"] = (
                latency_us
                if type(latency_us) is float and latency_us >= 0.0
                else _real("latency_us", latency_us, at_least=0.0)
            )
        if detail is not None:
            values["detail"] = detail if type(detail) is str else _text("detail", detail)
        if values["event"] == "materialized" and self.role != "recipient":
            raise _invalid("role", role, f"`materialized` is a recipient's reuse: role {self.role!r} may not write it")

    def to_json(self) -> str:
        """The record as one compact JSON object (pydantic's serializer: the bytes the pydantic model wrote)."""
        return self.json_bytes().decode()

    def json_bytes(self) -> bytes:
        """:meth:`to_json` as the serializer's UTF-8 bytes (the writer's line: no decode here and encode at the send)."""
        return to_json(self.__dict__, inf_nan_mode="null")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AuditRecord):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the model it replaced

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name in _FIELDS if (value := getattr(self, name)) is not None)
        return f"AuditRecord({shown})"


def _values(kind: type[Enum]) -> dict[object, str]:
    """Member or value -> value (a str enum's member hashes by its name, so both keys are needed)."""
    return {**{m: m.value for m in kind}, **{m.value: m.value for m in kind}}


_EVENTS = _values(AuditEvent)
_ROLES = _values(Role)
_OUTCOMES = _values(Outcome)
_REASONS = _values(DeclineReason)


def _count_of(name: str, value: object) -> int:
    if type(value) is int and value >= 0:
        return value
    return _count(name, value)


def _invalid(name: str, value: object, message: str) -> ValidationError:
    error = PydanticCustomError("value_error", message)
    return ValidationError.from_exception_data("AuditRecord", [InitErrorDetails(type=error, loc=(name,), input=value)])


def _member(kind: type[Enum], name: str, value: object) -> str:
    if isinstance(value, kind):
        return value.value  # type: ignore[no-any-return]
    if type(value) is str:
        with contextlib.suppress(ValueError):
            return kind(value).value  # type: ignore[no-any-return]
    raise _invalid(name, value, f"not a {kind.__name__}: one of {', '.join(m.value for m in kind)}")


def _text(name: str, value: object) -> str:
    if type(value) is str:
        return value
    if isinstance(value, Enum) and isinstance(value, str):
        return value.value  # type: ignore[no-any-return]
    if isinstance(value, str):
        return str.__str__(value)
    raise _invalid(name, value, "not a string")


def _flag(name: str, value: object) -> bool:
    if value is True or value is False:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise _invalid(name, value, "not a boolean")


def _integer(name: str, value: object) -> int:
    if type(value) is int:
        return value
    if isinstance(value, int):  # bool, IntEnum
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _invalid(name, value, "not an integer")


def _count(name: str, value: object) -> int:
    out = _integer(name, value)
    if out < 0:
        raise _invalid(name, value, "must be >= 0")
    return out


def _real(name: str, value: object, *, at_least: float | None = None) -> float:
    if type(value) is float:
        out = value
    elif isinstance(value, int | float):
        out = float(value)
    else:
        raise _invalid(name, value, "not a number")
    if at_least is not None and not out >= at_least:
        raise _invalid(name, value, f"must be >= {at_least:g}")
    return out


class AuditWriter:
    """Thread-safe append-only JSONL writer (or in-memory sink when ``path`` is None).

    Each flushed write is one ``os.write`` of whole lines to a file opened for appending (no text or buffer layer). A
    process killed by SIGKILL inside that call can leave the line it was writing torn (Linux stops a write at a page
    boundary for a fatal signal): a writer opening a file that does not end with a newline ends the torn line first,
    so it stays one line of its own that :func:`read_audit` skips, and no later record is lost with it. Counts records
    by event and by decline reason so components can expose them as metrics and tests can check that counts match what
    happened.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, fsync: bool = False) -> None:
        self._lock = threading.Lock()
        self._fsync = fsync
        self._fd: int | None = None
        self._pending: list[bytes] = []  # lines written with flush=False, sent with the next flushed one
        self.path = Path(path) if path is not None else None
        self.records: list[AuditRecord] | None = None if path is not None else []
        self.by_event: Counter[str] = Counter()
        self.by_reason: Counter[str] = Counter()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            if _ends_torn(self.path):
                os.write(self._fd, b"\n")

    def write(self, record: AuditRecord | None = None, /, *, flush: bool = True, **fields: Any) -> AuditRecord:
        """Append one record (built from ``fields`` when ``record`` is None) and flush it.

        ``flush=False`` keeps the line for the next write (or :meth:`flush`) to send with its own: one system call for
        two records. Only for a record the same call follows with another before it returns (the connector's
        ``lookup`` before its verdict), so every record is still on disk when its call returns.
        """
        rec = record if record is not None else AuditRecord(**fields)
        line = rec.json_bytes() + b"\n"
        with self._lock:
            if self._fd is not None:
                self._pending.append(line)
                if flush:
                    self._send()
            elif self.records is not None:
                self.records.append(rec)
            self.by_event[rec.event] += 1
            if rec.rejection_reason is not None:
                self.by_reason[rec.rejection_reason] += 1
        return rec

    def flush(self) -> None:
        """Send records written with ``flush=False`` now."""
        with self._lock:
            if self._fd is not None and self._pending:
                self._send()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                if self._pending:
                    self._send()
                os.close(self._fd)
                self._fd = None

    def _send(self) -> None:
        """Write the pending lines (under the lock): whole lines, in order, however many calls the OS needs."""
        assert self._fd is not None
        data = b"".join(self._pending)
        self._pending.clear()
        # Usually one call takes it all; a view of the rest only after a short write (a memoryview on every send cost
        # ~0.3-1 µs of the connector's decision).
        sent = os.write(self._fd, data)
        if sent < len(data):
            rest = memoryview(data)[sent:]
            while rest:
                rest = rest[os.write(self._fd, rest) :]
        if self._fsync:
            os.fsync(self._fd)

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


def _ends_torn(path: Path) -> bool:
    """Whether the file's last line has no newline (a writer killed while writing it)."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def read_audit(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse an audit file; a torn line (a writer killed while writing it) is skipped."""
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
