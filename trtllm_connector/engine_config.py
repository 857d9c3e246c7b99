"""The TensorRT-LLM engine YAML that loads the SemBlend connector: one renderer, shared by every launcher.

The YAML is what ``trtllm-serve --extra_llm_api_options`` and ``python -m dynamo.trtllm --extra-engine-args``
read. ``kv_connector_config`` holds exactly the three keys TensorRT-LLM's strict ``KvCacheConnectorConfig``
accepts; SemBlend's own settings travel as ``SEMBLEND_*`` environment (:func:`engine_env`).

The text is written by hand in a fixed key order with fixed number formatting, so that the Helm chart
(``deploy/helm/semblend-dynamo/templates/_engine.tpl``) reproduces it byte for byte. Change both together;
``tests/helm/test_chart.py`` compares them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from semblend_dynamo.config import SemblendConfig, env_name, isolation_rule_error

CONNECTOR_MODULE = "trtllm_connector.connector"
CONNECTOR_SCHEDULER_CLASS = "SemBlendConnectorScheduler"
CONNECTOR_WORKER_CLASS = "SemBlendConnectorWorker"

Mode = Literal["exact", "shifted", "discovery_only"]
Isolation = Literal["none", "cache_salt", "no_block_reuse"]
CacheTransceiverBackend = Literal["DEFAULT", "UCX", "NIXL", "MPI"]


class EngineConfigSettings(BaseModel):
    """What the engine YAML depends on. Validated when built; invalid combinations raise ``ValueError``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Mode = Field("exact", description="exact | shifted | discovery_only (docs/architecture.md)")
    tokens_per_block: int = Field(32, ge=1, le=1024, description="KV tokens per block")
    free_gpu_memory_fraction: float = Field(
        0.85, gt=0.0, le=1.0, description="share of free GPU memory for the KV cache (two decimals)"
    )
    event_buffer_max_size: int = Field(
        100_000, ge=1, description="KV events buffered for Dynamo's KV router (Dynamo's default)"
    )
    isolation: Isolation = Field(
        "none", description="how shifted (approximate) KV is kept out of the exact cache; shifted requires one"
    )
    enable_partial_reuse: bool = Field(
        False, description="TensorRT-LLM partial block reuse; the connector only promises whole blocks"
    )
    cache_transceiver_backend: CacheTransceiverBackend | None = Field(
        None, description="KV transfer backend of disaggregated prefill/decode workers (None: aggregated)"
    )

    @field_validator("free_gpu_memory_fraction")
    @classmethod
    def _two_decimals(cls, value: float) -> float:
        # Rendered as %.2f here and in the Helm template; refusing extra digits keeps both exact.
        if float(f"{value:.2f}") != value:
            raise ValueError(f"free_gpu_memory_fraction={value!r} must have at most two decimals")
        return value

    @model_validator(mode="after")
    def _shifted_needs_isolation(self) -> EngineConfigSettings:
        problem = isolation_rule_error(self.mode, self.isolation)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def enable_block_reuse(self) -> bool:
        """False only when shifted spans are isolated by turning TensorRT-LLM block reuse off."""
        return not (self.mode == "shifted" and self.isolation == "no_block_reuse")

    @classmethod
    def from_config(
        cls,
        config: SemblendConfig,
        *,
        free_gpu_memory_fraction: float = 0.85,
        event_buffer_max_size: int = 100_000,
        enable_partial_reuse: bool = False,
    ) -> EngineConfigSettings:
        """The engine settings implied by a loaded :class:`SemblendConfig` (mode, block size, isolation)."""
        return cls.model_validate(
            {
                "mode": config.mode,
                "tokens_per_block": config.block_size,
                "isolation": config.isolation,
                "free_gpu_memory_fraction": free_gpu_memory_fraction,
                "event_buffer_max_size": event_buffer_max_size,
                "enable_partial_reuse": enable_partial_reuse,
            }
        )


def _bool(value: bool) -> str:
    return "true" if value else "false"


def render_engine_yaml(settings: EngineConfigSettings) -> str:
    """The engine YAML text for ``settings`` (fixed format; see the module docstring)."""
    s = settings
    text = (
        f"# SemBlend TensorRT-LLM engine config: mode={s.mode} isolation={s.isolation}\n"
        "backend: pytorch\n"
        "kv_cache_config:\n"
        f"  enable_block_reuse: {_bool(s.enable_block_reuse)}\n"
        f"  enable_partial_reuse: {_bool(s.enable_partial_reuse)}\n"
        f"  tokens_per_block: {s.tokens_per_block:d}\n"
        f"  free_gpu_memory_fraction: {s.free_gpu_memory_fraction:.2f}\n"
        f"  event_buffer_max_size: {s.event_buffer_max_size:d}\n"
        "kv_connector_config:\n"
        f"  connector_module: {CONNECTOR_MODULE}\n"
        f"  connector_scheduler_class: {CONNECTOR_SCHEDULER_CLASS}\n"
        f"  connector_worker_class: {CONNECTOR_WORKER_CLASS}\n"
    )
    if s.cache_transceiver_backend is not None:
        text += f"cache_transceiver_config:\n  backend: {s.cache_transceiver_backend}\n"
    return text


def engine_env(settings: EngineConfigSettings) -> dict[str, str]:
    """The ``SEMBLEND_*`` variables the connector needs to agree with the engine YAML's mode and block size."""
    cfg = SemblendConfig(
        discovery_only=settings.mode == "discovery_only",
        exact_materialization_only=settings.mode != "shifted",
        block_size=settings.tokens_per_block,
        isolation=settings.isolation,
    )
    full = cfg.to_env()
    names = ("discovery_only", "exact_materialization_only", "block_size", "isolation")
    return {env_name(n): full[env_name(n)] for n in names}
