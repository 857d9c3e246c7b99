"""trtllm_connector.engine_config: the engine YAML and SEMBLEND_* env shared by the launcher and the chart."""

from __future__ import annotations

import importlib
import importlib.util
import itertools

import pytest
import yaml
from pydantic import ValidationError

from semblend_dynamo.config import SemblendConfig
from trtllm_connector.engine_config import (
    CONNECTOR_MODULE,
    CONNECTOR_SCHEDULER_CLASS,
    CONNECTOR_WORKER_CLASS,
    EngineConfigSettings,
    engine_env,
    render_engine_yaml,
)

VALID = [
    (mode, isolation)
    for mode, isolation in itertools.product(
        ["exact", "shifted", "discovery_only"], ["none", "cache_salt", "no_block_reuse"]
    )
    if not (mode == "shifted" and isolation == "none")
]


@pytest.mark.parametrize(("mode", "isolation"), VALID)
def test_yaml_parses_to_the_documented_engine_config(mode: str, isolation: str) -> None:
    settings = EngineConfigSettings.model_validate(
        {"mode": mode, "isolation": isolation, "tokens_per_block": 64, "free_gpu_memory_fraction": 0.8}
    )
    doc = yaml.safe_load(render_engine_yaml(settings))
    assert list(doc) == ["backend", "kv_cache_config", "kv_connector_config"]
    assert doc["backend"] == "pytorch"
    assert doc["kv_connector_config"] == {
        "connector_module": CONNECTOR_MODULE,
        "connector_scheduler_class": CONNECTOR_SCHEDULER_CLASS,
        "connector_worker_class": CONNECTOR_WORKER_CLASS,
    }
    assert doc["kv_cache_config"] == {
        "enable_block_reuse": not (mode == "shifted" and isolation == "no_block_reuse"),
        "enable_partial_reuse": False,
        "tokens_per_block": 64,
        "free_gpu_memory_fraction": 0.8,
        "event_buffer_max_size": 100_000,
    }


def test_exact_output_is_fixed_text() -> None:
    # The Helm template reproduces this text byte for byte, so its exact shape is part of the contract.
    text = render_engine_yaml(EngineConfigSettings())
    assert text.splitlines()[1:6] == [
        "backend: pytorch",
        "kv_cache_config:",
        "  enable_block_reuse: true",
        "  enable_partial_reuse: false",
        "  tokens_per_block: 32",
    ]
    assert "  free_gpu_memory_fraction: 0.85\n" in text
    assert "  event_buffer_max_size: 100000\n" in text
    assert text.startswith("# SemBlend TensorRT-LLM engine config: mode=exact isolation=none\n")
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_connector_module_path_is_in_this_package() -> None:
    assert CONNECTOR_MODULE.split(".")[0] == EngineConfigSettings.__module__.split(".")[0]


def test_shifted_without_isolation_is_refused_with_a_reason() -> None:
    with pytest.raises(
        ValidationError, match="requires isolation: set SEMBLEND_ISOLATION=cache_salt or no_block_reuse"
    ):
        EngineConfigSettings(mode="shifted")


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("mode", "fuzzy", "'exact', 'shifted' or 'discovery_only'"),
        ("free_gpu_memory_fraction", 0.855, "at most two decimals"),
        ("free_gpu_memory_fraction", 0.0, "greater than 0"),
        ("free_gpu_memory_fraction", 1.5, "less than or equal to 1"),
        ("tokens_per_block", 0, "greater than or equal to 1"),
        ("event_buffer_max_size", 0, "greater than or equal to 1"),
        ("kv_connector_extra", 1, "Extra inputs are not permitted"),
    ],
)
def test_bad_settings_name_the_problem(field: str, value: object, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle) as info:
        EngineConfigSettings.model_validate({field: value})
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("exact", {"SEMBLEND_DISCOVERY_ONLY": "0", "SEMBLEND_EXACT_MATERIALIZATION_ONLY": "1"}),
        ("discovery_only", {"SEMBLEND_DISCOVERY_ONLY": "1", "SEMBLEND_EXACT_MATERIALIZATION_ONLY": "1"}),
        ("shifted", {"SEMBLEND_DISCOVERY_ONLY": "0", "SEMBLEND_EXACT_MATERIALIZATION_ONLY": "0"}),
    ],
)
def test_engine_env_round_trips_through_semblend_config(mode: str, expected: dict[str, str]) -> None:
    settings = EngineConfigSettings.model_validate({"mode": mode, "isolation": "cache_salt", "tokens_per_block": 16})
    env = engine_env(settings)
    assert env == {**expected, "SEMBLEND_BLOCK_SIZE": "16", "SEMBLEND_ISOLATION": "cache_salt"}
    cfg = SemblendConfig.load(env=env)
    assert cfg.mode == mode
    assert EngineConfigSettings.from_config(cfg) == settings


def test_unisolated_shifted_mode_never_reaches_the_engine_config() -> None:
    with pytest.raises(ValidationError, match="requires isolation"):  # SemblendConfig's validator refuses it
        EngineConfigSettings.from_config(SemblendConfig(exact_materialization_only=False))


def test_disaggregated_workers_get_a_cache_transceiver() -> None:
    aggregated = render_engine_yaml(EngineConfigSettings())
    disaggregated = render_engine_yaml(EngineConfigSettings(cache_transceiver_backend="UCX"))
    assert disaggregated == aggregated + "cache_transceiver_config:\n  backend: UCX\n"
    assert yaml.safe_load(disaggregated)["cache_transceiver_config"] == {"backend": "UCX"}


@pytest.mark.skipif(importlib.util.find_spec(CONNECTOR_MODULE) is None, reason=f"{CONNECTOR_MODULE} has not landed yet")
def test_engine_yaml_names_classes_the_connector_module_defines() -> None:
    # TensorRT-LLM imports connector_module and looks the two classes up by name at engine start-up.
    module = importlib.import_module(CONNECTOR_MODULE)
    for name in (CONNECTOR_SCHEDULER_CLASS, CONNECTOR_WORKER_CLASS):
        assert isinstance(getattr(module, name), type), name
