from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semblend_apps.cli import main
from semblend_apps.replay.runner import BackendOutcome, ReplayClass, load_embedder, run_replay
from semblend_apps.replay.workload import RequestKind, WorkloadDonor, WorkloadRequest, build_workload
from semblend_dynamo.audit import read_audit
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.namespace import ModelIdentity, NamespaceKey
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.pipeline import DiscoveryResult
from semblend_dynamo.tokenizer import TokenizerAdapter

STAGES = ("exact_check", "align", "plan", "embed", "search", "total")


def replay_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert (
        main(["replay", "--json", "--backend", "none", *args]) == 0
    )  # the plan-only chain (connector: tests/connector)
    return json.loads(capsys.readouterr().out)


def check_acceptance(data: dict[str, Any]) -> None:
    assert data["missing_classes"] == [], data["outcomes"]
    for cls in data["expected_classes"]:
        assert data["outcomes"][cls] >= 1
    assert data["negative_controls"]["requests"] >= 2
    assert data["negative_controls"]["materializations"] == 0
    assert sum(data["outcomes"].values()) == data["workload"]["requests"]


def test_replay_json_acceptance_with_default_modes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    data = replay_json(capsys, "--embedder", "hash", "--audit-path", str(audit))
    check_acceptance(data)
    assert data["config"]["mode"] == "exact"
    assert set(data["expected_classes"]) == {"exact", "declined", "cold", "placement", "would_materialize"}
    assert data["by_kind"]["exact_repeat"] == {"exact": 4}
    assert data["by_kind"]["instruction_variant"] == {"declined": 4}  # shifted spans are off by default
    assert data["declined_by_reason"]["exact_only_mode"] == 4
    assert data["declined_by_reason"]["empty_prompt"] == 1
    assert data["reused_tokens"] > 0
    for stage in STAGES:
        assert {"p50", "p99", "n"} <= set(data["latency_us"][stage])
        assert data["latency_us"][stage]["p99"] >= data["latency_us"][stage]["p50"]
    assert Path(data["audit_path"]).parent == tmp_path  # this run's own file, beside --audit-path
    records = read_audit(data["audit_path"])
    events = [r["event"] for r in records]
    assert events.count("donor_registered") == data["workload"]["donors"]
    router = [r for r in records if r["event"] in ("routed", "declined")]  # one router record per request
    assert len(router) == len({r["trace_id"] for r in router}) == data["workload"]["requests"]
    assert all(r["role"] == "recipient" for r in router)
    assert all(r["role"] == "donor_prefill" for r in records if r["event"] == "donor_registered")
    declined = [r for r in records if r["event"] == "declined"]
    assert declined and all("rejection_reason" in r for r in declined)


def test_shifted_mode_materializes_reorders_and_never_negatives(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = replay_json(
        capsys,
        "--embedder",
        "hash",
        "--exact-materialization-only",
        "0",
        "--isolation",
        "cache_salt",
        "--audit-path",
        str(tmp_path / "a.jsonl"),
    )
    check_acceptance(data)
    assert data["by_kind"]["rag_reorder"] == {"would_materialize": 4}
    # instruction framings have unaligned lengths: the document cannot extend the prefix (TRT-LLM contract)
    assert data["by_kind"]["instruction_variant"] == {"declined": 4}
    assert data["declined_by_reason"]["not_prefix_contiguous"] == 4


def test_discovery_only_mode_reports_evidence_without_plans(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = replay_json(capsys, "--embedder", "hash", "--discovery-only", "1", "--audit-path", str(tmp_path / "a.jsonl"))
    check_acceptance(data)
    assert data["outcomes"]["discovery_only"] >= 1
    assert data["outcomes"]["would_materialize"] == 0 and data["reused_tokens"] == 0


def test_replay_is_deterministic(tmp_path: Path) -> None:
    cfg = SemblendConfig(embedder="hash", audit_path=str(tmp_path / "a.jsonl"))
    first = run_replay(cfg, units=2, seed=7)
    second = run_replay(cfg, units=2, seed=7)
    assert [(r.request_id, r.replay_class, r.reason, r.reused_tokens) for r in first.requests] == [
        (r.request_id, r.replay_class, r.reason, r.reused_tokens) for r in second.requests
    ]
    tok = TokenizerAdapter.bundled()
    assert build_workload(tok, seed=7) == build_workload(tok, seed=7)
    assert build_workload(tok, seed=7) != build_workload(tok, seed=8)


def test_workload_records_intended_kinds_and_related_donors() -> None:
    workload = build_workload(TokenizerAdapter.bundled(), units=2)
    assert set(workload.kinds()) == set(RequestKind) - {RequestKind.OTHER}  # OTHER: manifest transforms only
    donor_ids = {d.donor_id for d in workload.donors}
    for request in workload.requests:
        assert set(request.related_donors) <= donor_ids
        if request.kind is RequestKind.NEGATIVE_CONTROL:
            assert request.related_donors == []


@pytest.mark.parametrize("args", [["--block-size", "0"], ["--block-size", "256"], ["--min-similarity", "2"]])
def test_bad_config_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    assert main(["replay", "--embedder", "hash", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "SEMBLEND_" in err


class RecordingBackend:
    """Test double for the backend hook: loads every second accepted plan, declines the others."""

    def __init__(self) -> None:
        self.donors: list[str] = []
        self.executed: list[str] = []
        self.identity = ModelIdentity.from_config(SemblendConfig(embedder="hash"))

    def register_donor(self, donor: WorkloadDonor, namespace: NamespaceKey, *, trace_id: str) -> None:
        self.donors.append(donor.donor_id)

    def execute(
        self, request: WorkloadRequest, namespace: NamespaceKey, result: DiscoveryResult, *, trace_id: str
    ) -> BackendOutcome:
        assert result.decision.plan is not None
        self.executed.append(request.request_id)
        if len(self.executed) % 2:
            return BackendOutcome(materialized_tokens=result.decision.plan.reused_tokens)
        return BackendOutcome(materialized_tokens=0, reason=DeclineReason.DONOR_EVICTED)


def test_backend_hook_turns_plans_into_backend_outcomes(tmp_path: Path) -> None:
    backend = RecordingBackend()
    report = run_replay(SemblendConfig(embedder="hash", audit_path=str(tmp_path / "a.jsonl")), units=2, backend=backend)
    assert len(backend.donors) == report.workload["donors"]
    assert report.outcomes["would_materialize"] == 0
    assert report.outcomes["materialized"] + report.outcomes["backend_declined"] == len(backend.executed) > 1
    assert report.declined_by_reason["donor_evicted"] == report.outcomes["backend_declined"]
    assert report.missing_classes == []


def test_replay_with_minilm_when_available(tmp_path: Path) -> None:
    cfg = SemblendConfig(embedder="minilm", audit_path=str(tmp_path / "a.jsonl"))
    notices: list[str] = []
    embedder = load_embedder(cfg, notices)
    if notices:
        pytest.skip(notices[0])
    report = run_replay(cfg, units=1, embedder=embedder)
    assert report.config["embedder"] != "hash" and "minilm" in report.config["embedder"].lower()
    assert report.negative_controls["materializations"] == 0
    assert report.outcomes[ReplayClass.EXACT.value] >= 1 and report.outcomes[ReplayClass.WOULD_MATERIALIZE.value] >= 1
    assert report.latency_us["embed"]["n"] >= 1
