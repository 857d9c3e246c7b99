"""The two-path import of TensorRT-LLM's connector base classes, and the local stand-ins."""

from __future__ import annotations

import importlib
import sys
import types
from abc import ABC

import pytest

import trtllm_connector.base as base


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


def test_local_stand_ins_are_used_without_tensorrt_llm() -> None:
    assert base.TRTLLM_CONNECTOR_MODULE is None
    assert base.KvCacheConnectorScheduler is base.LocalKvCacheConnectorScheduler
    assert base.RequestData is base.LocalRequestData


@pytest.mark.parametrize("path", base.TRTLLM_MODULE_PATHS)
def test_either_tensorrt_llm_module_path_is_imported(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    fake = _fake_trtllm_module(path)
    monkeypatch.setitem(sys.modules, path, fake)
    try:
        reloaded = importlib.reload(base)
        assert path == reloaded.TRTLLM_CONNECTOR_MODULE
        assert reloaded.KvCacheConnectorScheduler is fake.KvCacheConnectorScheduler  # type: ignore[attr-defined]
        assert reloaded.RequestData is reloaded.LocalRequestData  # 1.2 modules without RequestData
    finally:
        monkeypatch.undo()
        importlib.reload(base)
    assert base.TRTLLM_CONNECTOR_MODULE is None


def test_local_scheduler_abc_has_the_1_2_signature() -> None:
    methods = {"build_connector_meta", "get_num_new_matched_tokens", "update_state_after_alloc", "request_finished"}
    assert base.LocalKvCacheConnectorScheduler.__abstractmethods__ == methods
    worker_methods = {
        "register_kv_caches",
        "start_load_kv",
        "wait_for_layer_load",
        "save_kv_layer",
        "wait_for_save",
        "get_finished",
    }
    assert base.LocalKvCacheConnectorWorker.__abstractmethods__ == worker_methods
