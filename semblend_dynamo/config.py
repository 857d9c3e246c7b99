"""One typed configuration model for every component (modes and rules: docs/architecture.md).

A setting has one name everywhere: the field ``min_similarity`` is the environment variable
``SEMBLEND_MIN_SIMILARITY``, the CLI flag ``--min-similarity`` and the YAML key ``min_similarity``
(``SEMBLEND_MIN_SIMILARITY`` is accepted as a YAML key too). Precedence, lowest first:
defaults < YAML file (``SEMBLEND_CONFIG`` / ``--config``) < environment < CLI flags.

Bad values fail at start-up with :class:`ConfigError`, whose message names the variable, the value
and what is allowed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "SEMBLEND_"
SECRET_SETTINGS = ("nats_password", "nats_token")
"""Settings never printed: shown as ``***`` by ``redacted()`` and by every command that echoes configuration."""
NON_SETTING_VARIABLES = {
    "SEMBLEND_CONFIG": "the YAML file of settings",
    "SEMBLEND_LOG_LEVEL": "the router's log level (--log-level)",
    "SEMBLEND_KEEP_TEST_LOGS": "tests: keep the logs of the processes a test started",
    "SEMBLEND_VERSION": "the package version an image is built from (deploy/docker/Dockerfile build argument)",
    "SEMBLEND_NATIVE_ALIGNER": "0 turns the span aligner's compiled core off, read once per process (docs/pipeline.md)",
    "SEMBLEND_NATIVE_UNBOX": "0 turns the connector's C prompt unboxing off, read once per process (trtllm_connector/unbox.py)",
    "SEMBLEND_ALIGNER_RELEASE_GIL": "0 keeps the GIL held during the compiled span search, read once per process "
    "(docs/pipeline.md)",
    "SEMBLEND_NATIVE_PLANNER": "0 turns the planner's compiled accepting path and the span aligner's compiled spans off, "
    "read once per process "
    "(semblend_dynamo/native_planner.py)",
    "SEMBLEND_NATIVE_VALIDATION": "0 turns the connector's compiled load validation off, read once per process "
    "(trtllm_connector/native_validation.py)",
    "SEMBLEND_NATIVE_MAP": "0 turns the router's compiled bulk lookups and writes of its block maps off, read once per "
    "process (semblend_dynamo/router/u64map.py)",
    "SEMBLEND_NATIVE_ENTRIES": "0 turns the router's compiled donor entries of sync pages off, read once per process "
    "(semblend_dynamo/native_entries.py)",
}
"""``SEMBLEND_*`` variables that are not settings; any other unknown ``SEMBLEND_*`` variable is an error."""
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    """A configuration value is invalid. The message is meant for an operator."""


class IndexBackend(str, Enum):
    """ANN library behind the donor index (see docs/benchmarks.md for how the default was chosen)."""

    AUTO = "auto"
    NUMPY = "numpy"
    USEARCH = "usearch"


def isolation_rule_error(mode: str, isolation: str) -> str | None:
    """The one home of the rule "shifted spans need isolation": why ``mode`` with ``isolation`` must not run, or None.

    Shifted spans produce approximate KV; without isolation it would become exact reusable prefix-cache state.
    """
    if mode == "shifted" and isolation == "none":
        return (
            "SEMBLEND_EXACT_MATERIALIZATION_ONLY=0 (shifted spans) requires isolation: set SEMBLEND_ISOLATION="
            "cache_salt or no_block_reuse (approximate KV must never become exact reusable cache state)"
        )
    return None


def parse_kv_scale(text: str) -> tuple[float, ...]:
    """``SEMBLEND_KV_SCALE``: one finite positive number, or one per layer separated by commas."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"SEMBLEND_KV_SCALE={text!r}: numbers separated by commas") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"SEMBLEND_KV_SCALE={text!r}: every scale must be finite and > 0")
    return values


class SemblendConfig(BaseModel):
    """Every ``SEMBLEND_*`` setting. Defaults are the safe ones."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)

    # --- modes (docs/architecture.md) ----------------------------------------------------------
    enabled: bool = Field(True, description="semantic donor search on/off")
    min_similarity: float = Field(0.60, ge=0.0, le=1.0, description="cosine threshold for embedding evidence")
    embedder: Literal["minilm", "hash"] = Field(
        "minilm", description="minilm (ONNX Runtime) or hash (cheap deterministic fallback)"
    )
    discovery_only: bool = Field(False, description="lookup + telemetry only; the connector never promises tokens")
    strict_prefix_boundary: bool = Field(True, description="materialize only as a contiguous target prefix")
    exact_materialization_only: bool = Field(
        True, description="materialize only exact-equivalent KV; 0 enables shifted spans (needs isolation)"
    )

    # --- model / namespace ------------------------------------------------------------------------
    model_id: str = Field("default-model", min_length=1, description="served model id (namespace key)")
    tokenizer: str | None = Field(None, description="path to a tokenizer.json (default: the bundled tokenizer)")
    block_size: int = Field(32, ge=1, le=1024, description="KV tokens per block (TensorRT-LLM tokens_per_block)")
    kv_dtype: Literal["float16", "bfloat16", "fp8"] = Field("bfloat16", description="KV cache dtype")
    kv_scale: str | None = Field(
        None,
        description="fp8 KV: the checkpoint's KV dequantization scale (kv_cache_scaling_factor), one number or one "
        "per layer comma-separated (none: fp8 pools take exact loads only)",
    )

    # --- segmentation / embedding ---------------------------------------------------------------
    window_tokens: int = Field(256, ge=8, le=512, description="tokens per embedding window")
    window_overlap: int = Field(32, ge=0, le=256, description="tokens shared by consecutive windows")
    max_embed_windows: int = Field(4, ge=1, le=256, description="windows embedded per prompt on the routing path")
    onnx_provider: Literal["cpu", "cuda"] = Field("cpu", description="ONNX Runtime execution provider")
    onnx_precision: Literal["fp32", "int8"] = Field(
        "fp32", description="MiniLM weights: fp32, or per-channel int8 (about 2x faster on CPU; never mix in one index)"
    )
    onnx_cache_dir: str | None = Field(None, description="where the built ONNX graph is cached")

    # --- donor index ----------------------------------------------------------------------------
    index_capacity: int = Field(100_000, ge=1, description="max donors per index (LRU eviction beyond)")
    index_backend: IndexBackend = Field(IndexBackend.AUTO, description="auto | numpy | usearch")
    index_dtype: Literal["f16", "i8"] = Field(
        "i8",
        description="usearch backend's vector storage: i8 (each vector scaled to its own +-127 range, 1 byte a "
        "dimension, similarities within ~3e-3) or f16 (2 bytes a dimension)",
    )
    top_k: int = Field(8, ge=1, le=256, description="candidate donors returned by the embedding search")

    # --- planner gates ----------------------------------------------------------------------------
    min_span_tokens: int = Field(64, ge=1, description="shortest token-exact span worth materializing")
    min_reuse_ratio: float = Field(0.30, ge=0.0, le=1.0, description="min share of the prompt reused")
    max_spans: int = Field(8, ge=1, le=1024, description="max donor spans composed into one target")
    max_deviation: float = Field(
        0.35, ge=0.0, le=1.0, description="max estimated layer deviation (bathtub gate) for shifted spans"
    )
    exact_route_threshold: float = Field(
        0.50, ge=0.0, le=1.0, description="exact prefix coverage at or above which exact routing wins"
    )

    # --- prefill chain (shifted mode: donor spans behind the recipient's own words) -------------------------
    chain_enabled: bool = Field(
        False, description="run a router-orchestrated prefill chain for non-prefix spans (shifted mode only)"
    )
    chain_head_tokens: int = Field(16, ge=0, le=4096, description="tokens at the head of each span recomputed")
    chain_step_overhead_tokens: int = Field(
        256, ge=0, description="cost of one chain step (a scheduling round trip), in prefill-token equivalents"
    )
    chain_min_speedup: float = Field(1.5, ge=1.0, description="predicted cold/chain cost a chain must reach")
    chain_max_deviation: float = Field(
        0.15, ge=0.0, le=1.0, description="max estimated deviation of a chain's loads (stricter than max_deviation)"
    )
    chain_max_steps: int = Field(4, ge=1, le=64, description="most prefill-only steps before the real request")
    chain_step_timeout_s: float = Field(10.0, gt=0.0, description="a chain step slower than this cancels the chain")

    # --- connector ------------------------------------------------------------------------------
    min_donor_tokens: int = Field(128, ge=1, description="finished requests shorter than this are not donors")
    pin_budget_fraction: float = Field(0.10, ge=0.0, le=0.9, description="max share of KV blocks pinned by donors")
    pin_ttl_s: float = Field(300.0, gt=0.0, description="seconds a donor pin lives without use")
    isolation: Literal["none", "cache_salt", "no_block_reuse"] = Field(
        "none", description="how approximate KV is kept out of the exact cache (shifted mode requires one)"
    )
    audit_path: str | None = Field(
        None,
        description="audit JSON lines file; each run writes <stem>.<run id><suffix> beside it unless audit_append "
        "(none: audit kept in memory)",
    )
    audit_append: bool = Field(False, description="append every run to audit_path itself instead of a file per run")
    rope_config: str | None = Field(
        None,
        description="model config.json path or inline JSON giving RoPE and KV geometry (default: <model dir>/config.json)",
    )
    worker_id: int = Field(0, ge=0, lt=1 << 64, description="this worker's id in hints, donor ids and outcomes")
    connector_nats: bool = Field(
        False, description="connector receives hints and publishes outcomes/donor lifecycle on NATS (nats_url)"
    )

    # --- Dynamo / NATS --------------------------------------------------------------------------
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server URL")
    nats_user: str | None = Field(None, description="NATS user")
    nats_password: str | None = Field(None, description="NATS password")
    nats_token: str | None = Field(None, description="NATS token")
    nats_creds_file: str | None = Field(None, description="NATS credentials file")
    dynamo_namespace: str = Field("dynamo", min_length=1, description="Dynamo namespace of the workers")
    worker_component: str = Field("backend", min_length=1, description="Dynamo component of the workers")
    worker_endpoint: str = Field("generate", min_length=1, description="Dynamo endpoint of the workers")
    router_component: str = Field("semblend", min_length=1, description="Dynamo component of the router")
    router_namespace: str | None = Field(
        None, description="Dynamo namespace the router serves and registers its model card in (none: dynamo_namespace)"
    )
    register_model: bool = Field(True, description="register a model card for the router so a Dynamo Frontend finds it")
    model_path: str | None = Field(
        None, description="model dir or HF id whose tokenizer/chat template the router's card carries (none: no assets)"
    )
    evidence_queue_size: int = Field(1024, ge=1, description="bounded evidence publish queue (drops counted)")
    placement_load_slack: int = Field(
        8, ge=0, description="router: max active requests a donor's worker may exceed the least loaded one by"
    )
    max_message_bytes: int = Field(1 << 20, ge=1024, description="messages larger than this are rejected")
    sync_page_donors: int = Field(
        4096, ge=1, le=4096, description="router: donor registrations per sync reply page (also max_message_bytes)"
    )
    sync_rate_per_s: float = Field(
        200.0, gt=0, description="router: sync requests answered per second per requesting router (excess counted)"
    )
    sync_window: int = Field(
        8, ge=1, le=64, description="router: sync requests in flight per peer while a replica catches up"
    )
    sync_index_snapshots: bool = Field(
        True,
        description="router: a replica with an empty usearch index loads the first syncing peer's index saved whole "
        "(a temporary file, TMPDIR) instead of inserting every donor, and sends its own to peers that ask",
    )
    embed_queue_size: int = Field(
        64, ge=1, description="router: prompts waiting for an embedding (beyond: routed exact-only, counted)"
    )
    embed_budget_ms: float = Field(
        50.0, gt=0, description="router: longest a request waits for its prompt embedding (beyond: exact-only, counted)"
    )
    gil_switch_interval_ms: float = Field(
        0.5,
        gt=0,
        le=100,
        description="router: the interpreter's GIL switch interval; a background thread (donor indexing) holding the "
        "GIL gives it back to the event loop within it (Python's default, 5 ms, showed in request latency)",
    )
    heap_top_mib: int = Field(
        4,
        ge=0,
        le=32,
        description="router: free memory each of glibc's heap arenas may keep at its top, MiB (blocks this large are "
        "mapped on their own); 0: glibc's adaptive thresholds, under which each thread could keep up to 64 MiB that no "
        "trim returns",
    )
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus/health port (0: disabled)")
    metrics_host: str = Field("127.0.0.1", description="bind address of the metrics/health server")
    kv_index_poll_s: float = Field(
        0.25, gt=0.0, le=60.0, description="router on the zmq event plane: seconds between reads of Dynamo's KV index"
    )
    spans_during_exact: bool = Field(
        True,
        description="router: search a request's spans while Dynamo's exact query is in flight when no worker holds "
        "what an exact win needs (off: after the exact answer, as before); the decision is the same either way",
    )
    log_format: Literal["text", "json"] = Field("text", description="router log lines: text, or one JSON object each")

    @field_validator("rope_config")
    @classmethod
    def _inline_rope_config_is_a_json_object(cls, value: str | None) -> str | None:
        if value is not None and value.strip().startswith("{"):
            _json_object(value)
        return value

    @field_validator("kv_scale")
    @classmethod
    def _kv_scale_is_positive_numbers(cls, value: str | None) -> str | None:
        if value is not None:
            parse_kv_scale(value)
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> SemblendConfig:
        if self.window_overlap >= self.window_tokens:
            raise ValueError(
                f"SEMBLEND_WINDOW_OVERLAP ({self.window_overlap}) must be smaller than SEMBLEND_WINDOW_TOKENS "
                f"({self.window_tokens})"
            )
        problem = isolation_rule_error(self.mode, self.isolation)
        if problem is not None:
            raise ValueError(problem)
        return self

    def check_files(self) -> None:
        """Raise :class:`ConfigError` when a file setting cannot work on this machine (read or written at start-up)."""
        if self.tokenizer is not None:
            _readable_file("tokenizer", self.tokenizer)
        if self.rope_config is not None and not self.rope_config.strip().startswith("{"):
            _readable_file("rope_config", self.rope_config)
            read_model_config(self.rope_config)
        if self.nats_creds_file is not None:
            _readable_file("nats_creds_file", self.nats_creds_file)
        if self.audit_path is not None:
            _writable_file("audit_path", self.audit_path)
        if self.onnx_cache_dir is not None:
            _writable_dir("onnx_cache_dir", Path(self.onnx_cache_dir), self.onnx_cache_dir)

    # --- derived ----------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """``discovery_only`` | ``exact`` | ``shifted``: the effective materialization mode."""
        if self.discovery_only:
            return "discovery_only"
        return "exact" if self.exact_materialization_only else "shifted"

    # --- loading ----------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        *,
        env: Mapping[str, str] | None = None,
        yaml_path: str | os.PathLike[str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> SemblendConfig:
        """Merge defaults, YAML, environment and explicit overrides (CLI) into a validated config."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        path = yaml_path if yaml_path is not None else env.get(ENV_PREFIX + "CONFIG")
        if path:
            values.update(_read_yaml(Path(path)))
        for key in sorted(env):
            if (
                key.startswith(ENV_PREFIX)
                and key not in NON_SETTING_VARIABLES
                and key[len(ENV_PREFIX) :].lower() not in cls.model_fields
            ):
                raise ConfigError(f"unknown variable {key}{_did_you_mean(key)}; unset it or fix its name")
        for name in cls.model_fields:
            key = env_name(name)
            if key in env:
                values[name] = _coerce(name, env[key], source=key)
        for name, value in (overrides or {}).items():
            if value is not None:
                values[name] = value
        cfg = cls.validated(values)
        cfg.check_files()
        return cfg

    @classmethod
    def validated(cls, values: Mapping[str, Any]) -> SemblendConfig:
        """Build from a dict, turning pydantic errors into one operator-readable :class:`ConfigError`."""
        unknown = [k for k in values if k not in cls.model_fields]
        if unknown:
            names = "; ".join(env_name(k) + _did_you_mean(env_name(k)) for k in unknown)
            raise ConfigError(f"unknown setting(s) {names}; `semblend-dynamo config --help` lists them all")
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, values)) from None

    def to_env(self) -> dict[str, str]:
        """The ``SEMBLEND_*`` environment that reproduces this config (None values omitted)."""
        out: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool):
                text = "1" if value else "0"
            elif isinstance(value, Enum):
                text = str(value.value)
            else:
                text = str(value)
            out[env_name(name)] = text
        return out


def redacted(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (keyed by field or env name) with the secret settings that are set replaced by ``***``."""
    secret = set(SECRET_SETTINGS) | {env_name(n) for n in SECRET_SETTINGS}
    return {k: ("***" if k in secret and v is not None else v) for k, v in values.items()}


def env_name(field: str) -> str:
    """``min_similarity`` -> ``SEMBLEND_MIN_SIMILARITY``."""
    return ENV_PREFIX + field.upper()


def _did_you_mean(variable: str) -> str:
    known = [env_name(n) for n in SemblendConfig.model_fields] + list(NON_SETTING_VARIABLES)
    by_suffix = {k[len(ENV_PREFIX) :]: k for k in known}  # the shared prefix would make every name look close
    close = difflib.get_close_matches(variable[len(ENV_PREFIX) :], list(by_suffix), n=1, cutoff=0.75)
    return f" (did you mean {by_suffix[close[0]]}?)" if close else ""


def flag_name(field: str) -> str:
    """``min_similarity`` -> ``--min-similarity``."""
    return "--" + field.replace("_", "-")


def _field_type(name: str) -> Any:
    annotation = SemblendConfig.model_fields[name].annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _coerce(name: str, raw: str, *, source: str) -> Any:
    """Parse a string (env var or CLI flag) into the field's type; ConfigError on nonsense."""
    kind = _field_type(name)
    text = raw.strip()
    if kind is bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"{source}={raw!r}: expected a boolean (1/0, true/false, yes/no, on/off)")
    if kind is str and text == "" and SemblendConfig.model_fields[name].default is None:
        return None
    return text  # pydantic converts numbers, enums and literals and reports what is allowed


def _describe(exc: ValidationError, values: Mapping[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        loc = err.get("loc") or ()
        field = str(loc[0]) if loc else ""
        msg = err["msg"].removeprefix("Value error, ")
        if field in SemblendConfig.model_fields:
            value = values.get(field, SemblendConfig.model_fields[field].default)
            desc = SemblendConfig.model_fields[field].description or ""
            lines.append(f"{env_name(field)}={value!r}: {msg} ({desc})")
        else:
            lines.append(msg)
    return "; ".join(lines)


def _json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc}); give the model's config.json path or a JSON object") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object (the model's config.json), got {type(data).__name__}")
    return data


def read_model_config(source: str) -> dict[str, Any]:
    """A Hugging Face ``config.json`` given as a path or inline JSON. Raises :class:`ConfigError` naming the setting."""
    text = source.strip()
    try:
        return _json_object(text if text.startswith("{") else Path(text).read_text())
    except OSError as exc:
        raise ConfigError(f"SEMBLEND_ROPE_CONFIG={source!r}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise ConfigError(f"SEMBLEND_ROPE_CONFIG={source!r}: {exc}") from None


def _readable_file(field: str, value: str) -> Path:
    path = Path(value)
    if not path.exists():
        raise ConfigError(f"{env_name(field)}={value!r}: file does not exist; give the path of an existing file")
    if not path.is_file():
        raise ConfigError(f"{env_name(field)}={value!r}: not a file; give the path of a file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{env_name(field)}={value!r}: file is not readable; fix its permissions")
    return path


def _writable_file(field: str, value: str) -> None:
    """The file can be appended to, or created (with its missing parent directories)."""
    path = Path(value)
    if path.is_dir():
        raise ConfigError(f"{env_name(field)}={value!r}: is a directory; give a file path inside it")
    if path.exists():
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            raise ConfigError(f"{env_name(field)}={value!r}: file is not writable ({exc.strerror})") from None
        return
    _writable_dir(field, path.parent, value)


def _writable_dir(field: str, path: Path, value: str) -> None:
    """``path`` is, or can be created as, a directory this process may write files in (probed, nothing left behind)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{env_name(field)}={value!r}: {str(existing)!r} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{env_name(field)}={value!r}: cannot create files in {str(existing)!r} ({exc.strerror}); "
            "choose a writable location"
        ) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"SEMBLEND_CONFIG={str(path)!r}: cannot read config file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"SEMBLEND_CONFIG={str(path)!r}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"SEMBLEND_CONFIG={str(path)!r}: expected a mapping of settings, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key)
        if name.upper().startswith(ENV_PREFIX):
            name = name[len(ENV_PREFIX) :].lower()
        name = name.replace("-", "_")
        if isinstance(value, str):
            value = _coerce(name, value, source=env_name(name)) if name in SemblendConfig.model_fields else value
        out[name] = value
    return out


SETTING_GROUPS: dict[str, tuple[str, ...]] = {
    "modes": (
        "enabled",
        "discovery_only",
        "exact_materialization_only",
        "isolation",
        "strict_prefix_boundary",
        "min_similarity",
        "embedder",
    ),
    "model": ("model_id", "tokenizer", "block_size", "kv_dtype", "kv_scale", "rope_config"),
    "embedding": (
        "window_tokens",
        "window_overlap",
        "max_embed_windows",
        "onnx_provider",
        "onnx_precision",
        "onnx_cache_dir",
    ),
    "donor index": ("index_capacity", "index_backend", "index_dtype", "top_k"),
    "planner gates": ("min_span_tokens", "min_reuse_ratio", "max_spans", "max_deviation", "exact_route_threshold"),
    "prefill chain": (
        "chain_enabled",
        "chain_head_tokens",
        "chain_step_overhead_tokens",
        "chain_min_speedup",
        "chain_max_deviation",
        "chain_max_steps",
        "chain_step_timeout_s",
    ),
    "connector": ("min_donor_tokens", "pin_budget_fraction", "pin_ttl_s", "worker_id", "connector_nats"),
    "audit": ("audit_path", "audit_append"),
    "NATS": ("nats_url", "nats_user", "nats_password", "nats_token", "nats_creds_file", "max_message_bytes"),
    "Dynamo router": (
        "dynamo_namespace",
        "worker_component",
        "worker_endpoint",
        "router_component",
        "router_namespace",
        "register_model",
        "model_path",
        "evidence_queue_size",
        "placement_load_slack",
        "metrics_port",
        "metrics_host",
        "kv_index_poll_s",
        "spans_during_exact",
        "log_format",
        "sync_page_donors",
        "sync_rate_per_s",
        "sync_window",
        "sync_index_snapshots",
        "embed_queue_size",
        "embed_budget_ms",
        "gil_switch_interval_ms",
        "heap_top_mib",
    ),
}
"""Every setting in exactly one group (by concern); a command's help shows the groups it uses."""


def add_config_arguments(parser: argparse.ArgumentParser, groups: Sequence[str] | None = None) -> None:
    """Add ``--config`` and one flag per setting of ``groups`` (default: all), one argument group per concern.

    Every setting is also read from its ``SEMBLEND_*`` variable and YAML key whether or not it has a flag here.
    """
    parser.add_argument(
        "--config",
        dest="semblend_config",
        default=None,
        metavar="PATH",
        help="YAML file of settings, keyed by setting name (SEMBLEND_CONFIG)",
    )
    for title in groups if groups is not None else SETTING_GROUPS:
        group = parser.add_argument_group(f"{title} settings")
        for name in SETTING_GROUPS[title]:
            field = SemblendConfig.model_fields[name]
            group.add_argument(
                flag_name(name),
                dest=f"cfg_{name}",
                default=None,
                metavar=_metavar(name),
                help=f"{field.description} (default: {_default_text(field.default)}; {env_name(name)})",
            )


def _metavar(name: str) -> str:
    kind = _field_type(name)
    if kind is bool:
        return "0|1"
    if typing.get_origin(kind) is Literal:
        return "|".join(map(str, typing.get_args(kind)))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "|".join(str(m.value) for m in kind)
    if kind in (int, float):
        return "N" if kind is int else "X"
    return "PATH" if name.endswith(("_path", "_file", "_dir")) or name in ("tokenizer", "rope_config") else "TEXT"


def _default_text(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def config_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> SemblendConfig:
    """The config for a parsed command line: defaults < YAML < env < flags."""
    overrides: dict[str, Any] = {}
    for name in SemblendConfig.model_fields:
        raw = getattr(args, f"cfg_{name}", None)
        if raw is not None:
            overrides[name] = _coerce(name, raw, source=flag_name(name))
    return SemblendConfig.load(env=env, yaml_path=getattr(args, "semblend_config", None), overrides=overrides)
