"""The two-path import of TensorRT-LLM's connector base classes, and the local stand-ins of both API generations."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import types
from abc import ABC

import pytest

import trtllm_connector.base as base
from trtllm_connector.connector import SemBlendConnectorScheduler, SemBlendConnectorWorker


def _fake_trtllm_module(name: str) -> types.ModuleType:
    """A stand-in for a TensorRT-LLM connector module (the real wheel cannot be installed here)."""
    module = types.ModuleType(name)

    class KvCacheConnectorScheduler(ABC):  # noqa: B024 - mirrors the real ABC's name only
        pass

    class KvCacheConnectorWorker(ABC):  # noqa: B024
        pass

    class SchedulerOutput:
        pass

    module.KvCacheConnectorScheduler = KvCacheConnectorScheduler  # type: ignore[attr-defined]
    module.KvCacheConnectorWorker = KvCacheConnectorWorker  # type: ignore[attr-defined]
    module.SchedulerOutput = SchedulerOutput  # type: ignore[attr-defined]
    return module


def test_1_3_stand_ins_are_used_without_tensorrt_llm() -> None:
    assert base.TRTLLM_CONNECTOR_MODULE is None
    assert base.API_GENERATION == "1.3"
    assert base.KvCacheConnectorScheduler is base.STAND_INS["1.3"].scheduler
    assert base.RequestData is base.Local13RequestData


@pytest.mark.parametrize(("path", "generation"), list(zip(base.TRTLLM_MODULE_PATHS, base.API_GENERATIONS, strict=True)))
def test_either_tensorrt_llm_module_path_is_imported(
    monkeypatch: pytest.MonkeyPatch, path: str, generation: str
) -> None:
    fake = _fake_trtllm_module(path)
    monkeypatch.setitem(sys.modules, path, fake)
    try:
        reloaded = importlib.reload(base)
        assert path == reloaded.TRTLLM_CONNECTOR_MODULE
        assert generation == reloaded.API_GENERATION
        assert reloaded.KvCacheConnectorScheduler is fake.KvCacheConnectorScheduler  # type: ignore[attr-defined]
        assert reloaded.RequestData is reloaded.STAND_INS[generation].request_data  # modules without RequestData
    finally:
        monkeypatch.undo()
        importlib.reload(base)
    assert base.TRTLLM_CONNECTOR_MODULE is None


def test_the_newer_path_wins_when_both_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    for path in base.TRTLLM_MODULE_PATHS:
        monkeypatch.setitem(sys.modules, path, _fake_trtllm_module(path))
    try:
        assert base.TRTLLM_MODULE_PATHS[0] == importlib.reload(base).TRTLLM_CONNECTOR_MODULE
    finally:
        monkeypatch.undo()
        importlib.reload(base)


SCHEDULER_ABSTRACT = {
    "build_connector_meta",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "request_finished",
}
WORKER_ABSTRACT = {
    "register_kv_caches",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_finished",
}
FIELDS_1_2 = ["request_id", "new_tokens", "new_block_ids", "computed_position", "num_scheduled_tokens"]
FIELDS_1_3 = [*FIELDS_1_2, "block_hashes", "priorities", "cache_salt", "new_block_ids_by_layer_group"]


@pytest.mark.parametrize(("generation", "fields"), [("1.2", FIELDS_1_2), ("1.3", FIELDS_1_3)])
def test_each_generation_has_its_signatures(generation: str, fields: list[str]) -> None:
    stand_ins = base.STAND_INS[generation]
    assert stand_ins.scheduler.__abstractmethods__ == SCHEDULER_ABSTRACT
    assert stand_ins.worker.__abstractmethods__ == WORKER_ABSTRACT
    assert [f.name for f in dataclasses.fields(stand_ins.request_data)] == fields  # upstream's positional order
    hooks = {"request_reset", "cancel_load", "request_finished_by_layer_group", "supports_attention_dp"}
    assert all(hasattr(stand_ins.scheduler, h) for h in hooks) == (generation == "1.3")
    assert hasattr(stand_ins.scheduler_output(), "attention_dp_rank") == (generation == "1.3")


@pytest.mark.parametrize("generation", ["1.2", "1.3"])
def test_the_connector_implements_every_method_of_both_generations_with_their_signatures(generation: str) -> None:
    stand_ins = base.STAND_INS[generation]
    for ours, theirs in (
        (SemBlendConnectorScheduler, stand_ins.scheduler),
        (SemBlendConnectorWorker, stand_ins.worker),
    ):
        for name, member in inspect.getmembers(theirs, inspect.isfunction):
            if name.startswith("__") or name.startswith("_"):
                continue
            params = list(inspect.signature(member).parameters)
            assert list(inspect.signature(getattr(ours, name)).parameters)[: len(params)] == params, name
    assert SemBlendConnectorScheduler.supports_attention_dp is False
    assert SemBlendConnectorWorker.supports_attention_dp is False
    for name in ("request_reset", "cancel_load", "update_state_after_alloc_by_layer_group"):
        assert name in vars(SemBlendConnectorScheduler)  # implemented, not inherited no-ops
