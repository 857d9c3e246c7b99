"""Test double of SemBench's TensorRT-LLM audit parser: counts an audit file the way that parser documents it.

Written from its documented behaviour (docs/sembench.md, "How SemBench counts"), not from its code: records are
grouped by ``event`` alone, with no regard to role, component or request; a line that is not JSON is an error,
not fatal. Tests compare these counts with our own report of the same run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SemBenchCounts:
    donor_registrations: int = 0
    semantic_hits: int = 0
    materialization_events: int = 0
    materialized_units: int = 0
    rope_corrections: int = 0
    rejection_reasons: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def materialized_semantic_kv_reuse(self) -> bool:
        return self.semantic_hits > 0 and (self.materialization_events > 0 or self.materialized_units > 0)


def _units(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_trtllm_audit(path: str | Path) -> SemBenchCounts:
    counts = SemBenchCounts()
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            counts.errors.append(line)
            continue
        event = str(record.get("event") or "unknown")
        reason = str(record.get("rejection_reason") or "")
        if reason:  # any record carrying a reason counts, whatever its event
            counts.rejection_reasons[reason] = counts.rejection_reasons.get(reason, 0) + 1
        if event == "donor_registered":
            counts.donor_registrations += 1
        elif event == "lookup" and record.get("found") is True:
            counts.semantic_hits += 1
        elif event == "materialized":
            counts.materialization_events += 1
            counts.materialized_units += _units(record.get("materialized"))
            counts.rope_corrections += int(bool(record.get("requires_rope_correction")))
    return counts
