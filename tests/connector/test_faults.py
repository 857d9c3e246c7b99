"""Fault injection: an exception anywhere in the connector becomes internal_error, never a failed request."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from semblend_dynamo.audit import AuditEvent
from trtllm_connector.engine_state import EngineState
from trtllm_connector.model_info import ModelInfo

from .conftest import decline_reason, prompt, records


class InjectedFault(RuntimeError):
    """The exception the test doubles below raise."""


def raise_injected_fault(*args: Any, **kwargs: Any) -> Any:
    raise InjectedFault("injected fault")


BEFORE_PROMISE = [
    ("scheduler", "hints.take"),
    ("scheduler", "registry.longest_prefix"),
    ("scheduler", "planner.plan"),
    ("scheduler", "registry.get"),
    ("scheduler", "registry.lease"),
    ("state", "pool_state"),
    ("class", "namespace"),
    ("method", "_namespace_digest"),
]


def _patch(monkeypatch: pytest.MonkeyPatch, h: Any, where: str, path: str) -> None:
    if where == "state":
        monkeypatch.setattr(EngineState, path, raise_injected_fault)
    elif where == "class":
        monkeypatch.setattr(ModelInfo, path, raise_injected_fault)
        h.scheduler._digests.clear()
    elif where == "method":
        monkeypatch.setattr(h.scheduler, path, raise_injected_fault)
    else:
        owner_name, attr = path.split(".")
        monkeypatch.setattr(getattr(h.scheduler, owner_name), attr, raise_injected_fault)


@pytest.mark.parametrize(("where", "path"), BEFORE_PROMISE)
def test_fault_before_the_promise_runs_the_request_cold(make_harness, monkeypatch, where, path) -> None:
    h = make_harness()
    donor = prompt(50, 100)
    h.run_request(donor)
    target = donor[:72] + prompt(51, 30)
    _patch(monkeypatch, h, where, path)
    r = h.run_request(target)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert torch.equal(r.kv, h.fresh_kv(target))
    assert decline_reason(h, r.request_id) == "internal_error"
    assert "InjectedFault" in (records(h, "declined", r.request_id)[-1].detail or "")
    monkeypatch.undo()
    assert h.run_request(target).promised >= 72  # the connector is still healthy


def test_fault_in_the_span_aligner_runs_the_request_cold(make_harness, monkeypatch) -> None:
    h = make_harness(exact_materialization_only=False, isolation="no_block_reuse", max_deviation=0.9)
    shared = prompt(63, 64)
    h.run_request(prompt(64, 24) + shared)
    target = shared + prompt(65, 20)
    monkeypatch.setattr(h.scheduler.aligner, "align", raise_injected_fault)
    r = h.run_request(target)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert torch.equal(r.kv, h.fresh_kv(target))
    assert decline_reason(h, r.request_id) == "internal_error"
    monkeypatch.undo()
    assert h.run_request(target).promised >= 64  # the failed request is now a donor too


def test_fault_in_the_audit_of_a_promise_declines(make_harness, monkeypatch) -> None:
    h = make_harness()
    donor = prompt(53, 100)
    h.run_request(donor)
    real_write = h.scheduler.audit.write

    def write_failing_on_promise(record: Any = None, **fields: Any) -> Any:
        if (record.event if record is not None else fields.get("event")) == AuditEvent.PROMISED:
            raise InjectedFault("audit disk full")
        return real_write(record, **fields)

    monkeypatch.setattr(h.scheduler.audit, "write", write_failing_on_promise)
    r = h.run_request(donor[:72] + prompt(54, 30))
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "internal_error"
    assert all(d.leases == 0 for d in h.scheduler.registry.donors())


def test_fault_in_the_worker_copy_is_audited_after_the_promise(make_harness, monkeypatch) -> None:
    h = make_harness()
    donor = prompt(55, 100)
    h.run_request(donor)
    monkeypatch.setattr(h.worker, "_copy", raise_injected_fault)
    r = h.run_request(donor[:72] + prompt(56, 30))
    assert r.promised == 72  # promised before the fault: TensorRT-LLM has no way to take it back
    assert r.connector_written_blocks == []
    assert records(h, "materialized") == []
    [declined] = records(h, "declined", r.request_id)
    assert declined.rejection_reason == "internal_error" and "after promise" in (declined.detail or "")
    assert r.pinned is False  # its KV is wrong: never a donor


def test_fault_in_planning_drops_only_that_load(make_harness, monkeypatch) -> None:
    h = make_harness()
    donor = prompt(57, 100)
    h.run_request(donor)
    monkeypatch.setattr(h.scheduler, "_plan", raise_injected_fault)
    r = h.run_request(donor[:72] + prompt(58, 30))
    assert r.connector_written_blocks == [] and decline_reason(h, r.request_id) == "internal_error"
    assert r.pinned is False
    monkeypatch.undo()
    assert h.run_request(donor[:72] + prompt(59, 30)).connector_written_blocks != []


def test_fault_in_allocation_bookkeeping_drops_the_load(make_harness, monkeypatch) -> None:
    h = make_harness()
    donor = prompt(60, 100)
    h.run_request(donor)
    monkeypatch.setattr(h.scheduler.registry, "note_allocation", raise_injected_fault)
    r = h.run_request(donor[:72] + prompt(61, 30))
    assert r.connector_written_blocks == [] and decline_reason(h, r.request_id) == "internal_error"


def test_fault_in_request_finished_does_not_pin(make_harness, monkeypatch) -> None:
    h = make_harness()
    monkeypatch.setattr(h.scheduler.registry, "admit", raise_injected_fault)
    assert h.run_request(prompt(62, 100)).pinned is False
    assert h.pinned_blocks == 0
