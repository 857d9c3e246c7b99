"""``semblend-trtllm``: start a TensorRT-LLM worker with the SemBlend connector, or print its engine YAML.

``semblend-trtllm serve MODEL [--target trtllm-serve|dynamo] [--mode exact|shifted|discovery_only]
[--extra_llm_api_options YAML] [SemBlend flags] [-- flags for the launched program]`` renders the engine YAML with
:func:`trtllm_connector.engine_config.render_engine_yaml` (the same renderer as the Helm chart), merges the user's
YAML, exports the ``SEMBLEND_*`` environment (TensorRT-LLM's ``KvCacheConnectorConfig`` rejects unknown keys, so
SemBlend settings travel as environment), runs the GPU preflight (:mod:`trtllm_connector.preflight`) and ``exec``s
``trtllm-serve`` or, with ``--target dynamo``, a Dynamo worker as the Helm chart runs it (``python3 -m dynamo.trtllm
... --extra-engine-args YAML``). ``--dry-run`` prints the preflight, the command, the environment and the YAML
instead. ``semblend-trtllm print-config`` prints only the YAML; ``semblend-trtllm preflight`` only the preflight.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from pydantic import ValidationError

from semblend_dynamo.config import (
    ConfigError,
    SemblendConfig,
    add_config_arguments,
    config_from_args,
    env_name,
    redacted,
)

from . import preflight
from .engine_config import (
    CONNECTOR_MODULE,
    CONNECTOR_SCHEDULER_CLASS,
    CONNECTOR_WORKER_CLASS,
    EngineConfigSettings,
    render_engine_yaml,
)

MIN_TRTLLM = (1, 2)
MODES = {
    "exact": {"discovery_only": False, "exact_materialization_only": True},
    "shifted": {"discovery_only": False, "exact_materialization_only": False},
    "discovery_only": {"discovery_only": True},
}
OWNED_KV_CACHE_KEYS = ("enable_block_reuse", "enable_partial_reuse", "tokens_per_block")
"""``kv_cache_config`` keys the connector's safety (isolation, whole-block promises) depends on: a user YAML may
repeat them but not change them."""
TARGETS = ("trtllm-serve", "dynamo")


class LaunchError(Exception):
    """A problem the operator must fix; printed as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), as for every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="semblend-trtllm", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="start trtllm-serve or a Dynamo worker with the SemBlend connector",
        description="Flags after a lone -- go to the launched program unchanged.",
    )
    _add_common(serve)
    serve.add_argument(
        "--target",
        choices=TARGETS,
        default="trtllm-serve",
        help="trtllm-serve (OpenAI server) or dynamo (python3 -m dynamo.trtllm, as the Helm chart runs workers)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="trtllm-serve bind address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="trtllm-serve port (default: 8000)")
    serve.add_argument(
        "--served-model-name", default=None, help="dynamo: name clients use (default: model_id, else MODEL)"
    )
    serve.add_argument("--dry-run", action="store_true", help="print preflight, command, environment and YAML")
    serve.add_argument("--print-config", action="store_true", help="print only the engine YAML")
    serve.add_argument(
        "--engine-config-out", default=None, help="where to write the engine YAML (default: a temp file)"
    )
    serve.add_argument(
        "--skip-preflight", action="store_true", help="start without the GPU preflight (cuda-python checks)"
    )
    show = sub.add_parser(
        "print-config", help="print the engine YAML (for python -m dynamo.trtllm --extra-engine-args)"
    )
    _add_common(show)
    check = sub.add_parser("preflight", help="read the GPUs through cuda-python and check them for this config")
    _add_common(check)
    return parser


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs=None if p.prog.endswith(" serve") else "?", help="model path or Hugging Face id")
    p.add_argument("--mode", choices=sorted(MODES), default=None, help="materialization mode (default: from config)")
    p.add_argument(
        "--extra_llm_api_options",
        "--extra-llm-api-options",
        "--extra-engine-args",
        dest="extra_llm_api_options",
        default=None,
        metavar="YAML",
        help="your engine YAML (trtllm-serve's and Dynamo's spellings), merged with ours: the connector is always "
        "ours; block reuse, partial reuse and tokens_per_block must agree with the SemBlend mode",
    )
    p.add_argument(
        "--free-gpu-memory-fraction",
        type=float,
        default=0.85,
        help="kv_cache_config.free_gpu_memory_fraction (default: 0.85)",
    )
    p.add_argument(
        "--event-buffer-max-size",
        type=int,
        default=100_000,
        help="kv_cache_config.event_buffer_max_size: KV events buffered for Dynamo's router (default: 100000)",
    )
    add_config_arguments(p)


def launch_config(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[SemblendConfig, str]:
    """The effective SemBlend config and the merged engine YAML text for parsed arguments."""
    cfg = config_from_args(args, env)
    updates: dict[str, Any] = dict(MODES[args.mode]) if args.mode else {}
    model = getattr(args, "model", None)
    if model and env_name("model_id") not in env and getattr(args, "cfg_model_id", None) is None:
        updates["model_id"] = model
    if model and cfg.rope_config is None and (Path(model) / "config.json").is_file():
        updates["rope_config"] = str(Path(model) / "config.json")
    if updates:
        cfg = SemblendConfig.validated({**cfg.model_dump(), **updates})
    try:
        settings = EngineConfigSettings.from_config(
            cfg,
            free_gpu_memory_fraction=args.free_gpu_memory_fraction,
            event_buffer_max_size=args.event_buffer_max_size,
        )
    except ValidationError as exc:
        raise LaunchError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())) from None
    text = render_engine_yaml(settings)
    if args.extra_llm_api_options:
        text = merge_user_yaml(text, Path(args.extra_llm_api_options))
    return cfg, text


def merge_user_yaml(ours: str, user_path: Path) -> str:
    """The user's engine YAML with ours merged over it where it matters.

    ``kv_connector_config`` is always ours (a note on stderr when the user's differed); the isolation-related
    ``kv_cache_config`` keys may repeat ours but not differ (one-line :class:`LaunchError`); everything else is the
    user's.
    """
    try:
        user = yaml.safe_load(user_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LaunchError(f"--extra_llm_api_options {user_path}: cannot read YAML: {first}") from None
    if not isinstance(user, dict) or not isinstance(user.get("kv_cache_config") or {}, dict):
        raise LaunchError(f"--extra_llm_api_options {user_path}: expected a mapping (and kv_cache_config a mapping)")
    base = yaml.safe_load(ours)
    for key in OWNED_KV_CACHE_KEYS:
        value = (user.get("kv_cache_config") or {}).get(key)
        if value is not None and value != base["kv_cache_config"][key]:
            raise LaunchError(
                f"--extra_llm_api_options {user_path}: kv_cache_config.{key}={value!r} conflicts with the SemBlend "
                f"mode (needs {base['kv_cache_config'][key]!r}); change the SemBlend settings instead"
            )
    connector = user.get("kv_connector_config")
    if connector is not None and connector != base["kv_connector_config"]:
        print(
            f"semblend-trtllm: note: kv_connector_config in {user_path} replaced by {CONNECTOR_MODULE}:"
            f"{CONNECTOR_SCHEDULER_CLASS}/{CONNECTOR_WORKER_CLASS}",
            file=sys.stderr,
        )
    merged = _deep_merge(base, user)
    merged["kv_connector_config"] = base["kv_connector_config"]
    return yaml.safe_dump(merged, sort_keys=False)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _deep_merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
        )
    return out


def launch_env(cfg: SemblendConfig, env: Mapping[str, str], target: str = "trtllm-serve") -> dict[str, str]:
    """The launched program's environment: ours plus every SEMBLEND_* setting and an importable connector.

    For ``dynamo`` also what the chart gives a worker: the NATS event plane (the router reads the workers' KV
    events there), the NATS URL, the workers' Dynamo namespace and the connector's NATS link.
    """
    out = dict(env)
    out.update(cfg.to_env())
    package_root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:  # MPI worker processes must import the connector module
        out["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    if target == "dynamo":
        out.update(
            {
                "DYN_EVENT_PLANE": "nats",
                "NATS_SERVER": cfg.nats_url,
                "DYN_NAMESPACE": cfg.dynamo_namespace,
                env_name("connector_nats"): "1",
            }
        )
    return out


def serve_command(args: argparse.Namespace, cfg: SemblendConfig, engine_yaml_path: str) -> list[str]:
    """The launched command line; arguments after ``--`` on ours are passed through."""
    if args.target == "dynamo":
        return [
            "python3",
            "-m",
            "dynamo.trtllm",
            "--model-path",
            args.model,
            "--served-model-name",
            args.served_model_name or cfg.model_id or args.model,
            "--extra-engine-args",
            engine_yaml_path,
            "--publish-events-and-metrics",
            "--kv-block-size",
            str(cfg.block_size),
            "--endpoint",
            f"dyn://{cfg.dynamo_namespace}.{cfg.worker_component}.{cfg.worker_endpoint}",
            *args.passthrough,
        ]
    return [
        "trtllm-serve",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--backend",
        "pytorch",
        "--extra_llm_api_options",
        engine_yaml_path,
        *args.passthrough,
    ]


def check_trtllm(target: str = "trtllm-serve") -> None:
    """Raise :class:`LaunchError` unless TensorRT-LLM >= 1.2 and the target's program are installed."""
    try:
        version = importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        raise LaunchError(
            "TensorRT-LLM is not installed (need tensorrt_llm >= 1.2 with its GPU wheels: pip install "
            "'semblend-dynamo[trtllm]' --extra-index-url https://pypi.nvidia.com)"
        ) from None
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) < MIN_TRTLLM:
        raise LaunchError(f"TensorRT-LLM {version} is too old: the connector API needs >= 1.2")
    if target == "dynamo":
        if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.trtllm") is None:
            raise LaunchError(f"TensorRT-LLM {version} is installed but dynamo.trtllm is not (pip install ai-dynamo)")
    elif shutil.which("trtllm-serve") is None:
        raise LaunchError(f"TensorRT-LLM {version} is installed but trtllm-serve is not on PATH")


def worker_needs(cfg: SemblendConfig, args: argparse.Namespace, engine_yaml: str) -> preflight.WorkerNeeds:
    """What this configuration asks of the GPU (FP8 from SemBlend's kv_dtype or the merged engine YAML)."""
    kv = yaml.safe_load(engine_yaml).get("kv_cache_config") or {}
    fp8 = cfg.kv_dtype == "fp8" or str(kv.get("dtype", "")).lower() == "fp8"
    return preflight.WorkerNeeds(
        triton_kernels=not cfg.discovery_only,
        fp8_kv=fp8,
        pin_budget_fraction=cfg.pin_budget_fraction,
        free_gpu_memory_fraction=float(kv.get("free_gpu_memory_fraction", args.free_gpu_memory_fraction)),
    )


def run_preflight(needs: preflight.WorkerNeeds, *, strict: bool) -> list[str]:
    """Preflight report lines. Refuses (``LaunchError``) what cannot work; without facts refuses only if strict."""
    try:
        gpus = preflight.read_gpu_facts()
    except preflight.PreflightUnavailable as exc:
        if strict:
            raise LaunchError(f"preflight: {exc}; --skip-preflight starts anyway") from None
        return [f"preflight skipped: {exc}"]
    found = preflight.problems(gpus, needs)
    if found:
        raise LaunchError(f"preflight: {found[0]}" + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""))
    return [preflight.describe(g) for g in gpus] + ["preflight passed"]


def _shown_env(env: Mapping[str, str], target: str) -> list[str]:
    extra = ("DYN_EVENT_PLANE", "NATS_SERVER", "DYN_NAMESPACE") if target == "dynamo" else ()
    shown = redacted({k: v for k, v in env.items() if k.startswith("SEMBLEND_") or k in ("PYTHONPATH", *extra)})
    return [f"{k}={shown[k]}" for k in sorted(shown)]


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    cfg, text = launch_config(args, env)
    if args.command == "print-config" or getattr(args, "print_config", False):
        sys.stdout.write(text)
        return 0
    needs = worker_needs(cfg, args, text)
    if args.command == "preflight":
        print("\n".join(run_preflight(needs, strict=True)))
        return 0
    if args.dry_run:
        report = ["preflight skipped: --skip-preflight"] if args.skip_preflight else run_preflight(needs, strict=False)
        child_env = launch_env(cfg, env, args.target)
        command = serve_command(args, cfg, args.engine_config_out or "<engine.yaml>")
        print("# preflight\n" + "\n".join(report))
        print("# command\n" + " ".join(command))
        print("# environment\n" + "\n".join(_shown_env(child_env, args.target)))
        print("# engine YAML\n" + text, end="")
        return 0
    check_trtllm(args.target)
    if not args.skip_preflight:
        for line in run_preflight(needs, strict=True):
            print(f"semblend-trtllm: {line}", file=sys.stderr)
    child_env = launch_env(cfg, env, args.target)
    if args.engine_config_out:
        path = args.engine_config_out
        Path(path).write_text(text)
    else:
        fd, path = tempfile.mkstemp(prefix="semblend-engine-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(text)
    command = serve_command(args, cfg, path)
    os.execvpe(command[0], command, child_env)
    return 0  # pragma: no cover - execvpe does not return


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, passthrough = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = build_parser()
    args = parser.parse_args(ours)
    args.passthrough = passthrough
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return run(args, os.environ)
    except (ConfigError, LaunchError) as exc:
        print(f"semblend-trtllm: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
