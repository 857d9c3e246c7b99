"""Through the replay pipeline and the connector: no KV crosses a namespace, and unknown tenants get nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from semblend_apps.replay.connector_backend import ConnectorReplayBackend
from semblend_apps.replay.runner import ExactPrefixIndex, ReplayClass, replay_request, run_replay
from semblend_apps.replay.workload import RequestKind, WorkloadRequest
from semblend_dynamo.audit import AuditWriter, read_audit
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.embedder import HashEmbedder
from semblend_dynamo.namespace import ModelIdentity
from semblend_dynamo.pipeline import DonorDiscovery

MODES = {
    "exact": {},
    "shifted": {"exact_materialization_only": False, "isolation": "cache_salt"},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_replay_through_the_connector_crosses_no_namespace(tmp_path: Path, mode: str) -> None:
    audit_path = tmp_path / "audit.jsonl"
    cfg = SemblendConfig(embedder="hash", audit_path=str(audit_path), audit_append=True, **MODES[mode])
    backend = ConnectorReplayBackend(cfg)
    report = run_replay(cfg, backend=backend, embedder=HashEmbedder())
    backend.close()
    records = [r for r in read_audit(audit_path) if "component" not in r]  # the connector's own records
    registered = {r["donor_id"]: r["namespace"] for r in records if r["event"] == "donor_registered"}
    loads = [r for r in records if r["event"] == "materialized"]
    crossings = sum(registered[d] != r["namespace"] for r in loads for d in r["donor_id"].split(","))
    assert len(loads) >= 4 and crossings == 0
    assert report.negative_controls["requests"] >= 2 and report.negative_controls["materializations"] == 0
    assert report.by_kind["negative_control"].get("materialized", 0) == 0
    assert report.by_kind["bad_input"].get("materialized", 0) == 0  # includes a tenant without donors


def test_replay_request_with_an_unknown_tenant_is_declined_before_discovery() -> None:
    cfg = SemblendConfig(embedder="hash")
    discovery = DonorDiscovery.from_config(cfg, embedder=HashEmbedder(), background=False)
    identity = ModelIdentity.from_config(cfg)
    tokens = list(range(1, 200))
    discovery.register_donor("d1", identity.namespace(tenant=""), tokens)
    request = WorkloadRequest(
        request_id="r1", kind=RequestKind.NEGATIVE_CONTROL, variant="unknown", tenant="", tokens=tokens[:150] + [7] * 20
    )
    known = replay_request(
        request,
        identity.namespace(),
        discovery=discovery,
        exact_index=ExactPrefixIndex(cfg.block_size),
        audit=AuditWriter(),
    )
    assert known.reused_tokens > 0  # the same request with its tenant known finds the donor
    unknown = replay_request(
        request.model_copy(update={"tenant_known": False}),
        identity.namespace(),
        discovery=discovery,
        exact_index=ExactPrefixIndex(cfg.block_size),
        audit=AuditWriter(),
    )
    assert (unknown.reused_tokens, unknown.reason, unknown.replay_class) == (0, "tenant_unknown", ReplayClass.DECLINED)
    assert discovery.counters["decline:tenant_unknown"] == 1
    discovery.close()
