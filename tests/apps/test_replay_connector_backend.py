"""`semblend-dynamo replay` continued through the connector in the PyExecutor harness: backend outcomes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semblend_apps.cli import main
from semblend_dynamo.audit import read_audit


def replay(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[dict[str, Any], list[dict]]:
    audit = tmp_path / "audit.jsonl"
    assert main(["replay", "--json", "--embedder", "hash", "--audit-path", str(audit), *args]) == 0
    data = json.loads(capsys.readouterr().out)
    return data, read_audit(data["audit_path"])  # this run's file, beside --audit-path


def _check(data: dict[str, Any], records: list[dict]) -> None:
    assert data["missing_classes"] == [], data["outcomes"]
    assert "materialized" in data["expected_classes"] and data["outcomes"]["would_materialize"] == 0
    assert data["negative_controls"]["materializations"] == 0
    assert sum(data["outcomes"].values()) == data["workload"]["requests"]
    connector = [r for r in records if "component" not in r]  # replay's own records name their component
    assert sum(r["event"] == "materialized" for r in connector) == data["outcomes"]["materialized"]  # no donor prefill
    assert data["reused_tokens"] > 0


def test_exact_mode_replay_materializes_through_the_connector(capsys, tmp_path) -> None:
    data, records = replay(capsys, tmp_path)
    _check(data, records)
    assert data["by_kind"]["same_doc_new_question"] == {"materialized": 4}
    assert all(not r.get("requires_rope_correction") for r in records if r["event"] == "materialized")


def test_shifted_mode_replay_materializes_with_rope_correction(capsys, tmp_path) -> None:
    data, records = replay(capsys, tmp_path, "--exact-materialization-only", "0", "--isolation", "cache_salt")
    _check(data, records)
    assert data["by_kind"]["rag_reorder"] == {"materialized": 4}
    assert any(r.get("requires_rope_correction") for r in records if r["event"] == "materialized")


def test_table_reports_connector_outcomes(capsys, tmp_path) -> None:
    assert main(["replay", "--embedder", "hash", "--audit-path", str(tmp_path / "a.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "tokens materialized by the connector" in out and "would_materialize" not in out
