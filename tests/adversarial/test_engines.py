"""Two engines in one process share nothing: pins, taints, pool facts, hints and audit stay with their engine."""

from __future__ import annotations

import gc

from semblend_dynamo.config import SemblendConfig
from tests.connector.conftest import BASE_SETTINGS, prompt, records
from trtllm_connector.engine_state import EngineState
from trtllm_connector.harness import HarnessLlmArgs, PyExecutorHarness


def _harness(clock, num_blocks: int, **settings) -> PyExecutorHarness:
    return PyExecutorHarness.with_stand_in(
        SemblendConfig(**{**BASE_SETTINGS, **settings}), num_blocks=num_blocks, clock=clock
    )


def test_two_connectors_in_one_process_do_not_see_each_other(clock) -> None:
    a = _harness(clock, num_blocks=64)
    b = _harness(clock, num_blocks=512)
    assert a.scheduler.state is a.worker.state and b.scheduler.state is b.worker.state
    assert a.scheduler.state is not b.scheduler.state
    assert (a.scheduler.state.pool_state().num_blocks, b.scheduler.state.pool_state().num_blocks) == (64, 512)
    donor = prompt(71, 100)
    assert a.run_request(donor).pinned
    # Same settings, same worker id, same request id 1: B still has no donor and its pin budget is its own pool's.
    assert (len(a.scheduler.registry), len(b.scheduler.registry)) == (1, 0)
    assert (a.scheduler.registry.budget_blocks, b.scheduler.registry.budget_blocks) == (32, 0)
    r = b.run_request(donor[:72] + prompt(72, 20))
    assert r.promised == 0 and records(a, "lookup") and len(records(b, "donor_registered")) == 1
    a.scheduler.state.taint(2)  # a failed load on A's request 2 must not stop B's request 2 from being a donor
    assert b.run_request(prompt(73, 100)).pinned
    assert b.scheduler.hints is not a.scheduler.hints


def test_the_state_goes_with_its_engine() -> None:
    args = HarnessLlmArgs(8)
    state = EngineState.of(args)
    assert EngineState.of(args) is state and EngineState.of(HarnessLlmArgs(8)) is not state
    del args
    gc.collect()
    assert EngineState.of(HarnessLlmArgs(8)) is not state
