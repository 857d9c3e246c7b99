"""``semblend-trtllm``: run ``trtllm-serve`` with the SemBlend connector, or print its engine YAML.

``semblend-trtllm serve MODEL [--host H --port P --mode exact|shifted|discovery_only
--extra-llm-api-options YAML] [SemBlend flags] [-- trtllm-serve args]`` renders the engine YAML with
:func:`trtllm_connector.engine_config.render_engine_yaml` (the same renderer as the Helm chart), merges the user's
YAML, exports the ``SEMBLEND_*`` environment (TensorRT-LLM's ``KvCacheConnectorConfig`` rejects unknown keys, so
SemBlend settings travel as environment) and ``exec``s ``trtllm-serve``. ``--dry-run`` prints the command, the
environment and the YAML instead. ``semblend-trtllm print-config`` (or ``serve --print-config``) prints only the
YAML, for ``python -m dynamo.trtllm --extra-engine-args``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
"""``kv_cache_config`` keys the connector's safety depends on: a user YAML may not change them."""


class LaunchError(Exception):
    """A problem the operator must fix; printed as one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semblend-trtllm", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="exec trtllm-serve with the SemBlend connector")
    _add_common(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--dry-run", action="store_true", help="print the command, environment and YAML; run nothing")
    serve.add_argument("--print-config", action="store_true", help="print only the engine YAML")
    serve.add_argument(
        "--engine-config-out", default=None, help="where to write the engine YAML (default: a temp file)"
    )
    show = sub.add_parser(
        "print-config", help="print the engine YAML (for python -m dynamo.trtllm --extra-engine-args)"
    )
    _add_common(show)
    return parser


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?" if p.prog.endswith("print-config") else None, help="model path or id")
    p.add_argument("--mode", choices=sorted(MODES), default=None, help="materialization mode (default: from config)")
    p.add_argument("--extra-llm-api-options", default=None, metavar="YAML", help="your engine YAML, merged over ours")
    p.add_argument("--free-gpu-memory-fraction", type=float, default=0.85)
    p.add_argument("--event-buffer-max-size", type=int, default=100_000)
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
    """Our engine YAML with the user's merged over it; the connector and its safety keys cannot be overridden."""
    try:
        user = yaml.safe_load(user_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise LaunchError(f"--extra-llm-api-options {user_path}: cannot read YAML: {exc}") from None
    if not isinstance(user, dict):
        raise LaunchError(f"--extra-llm-api-options {user_path}: expected a mapping at the top level")
    base = yaml.safe_load(ours)
    connector = user.get("kv_connector_config")
    if connector is not None and connector != base["kv_connector_config"]:
        raise LaunchError(
            f"--extra-llm-api-options {user_path}: kv_connector_config must stay {CONNECTOR_MODULE}:"
            f"{CONNECTOR_SCHEDULER_CLASS}/{CONNECTOR_WORKER_CLASS}"
        )
    for key in OWNED_KV_CACHE_KEYS:
        value = (user.get("kv_cache_config") or {}).get(key)
        if value is not None and value != base["kv_cache_config"][key]:
            raise LaunchError(
                f"--extra-llm-api-options {user_path}: kv_cache_config.{key}={value!r} conflicts with the SemBlend "
                f"mode (needs {base['kv_cache_config'][key]!r}); change the SemBlend settings instead"
            )
    return yaml.safe_dump(_deep_merge(base, user), sort_keys=False)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _deep_merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
        )
    return out


def launch_env(cfg: SemblendConfig, env: Mapping[str, str]) -> dict[str, str]:
    """The environment for trtllm-serve: ours plus every SEMBLEND_* setting and an importable connector."""
    out = dict(env)
    out.update(cfg.to_env())
    package_root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:  # MPI worker processes must import the connector module
        out["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    return out


def serve_command(args: argparse.Namespace, engine_yaml_path: str) -> list[str]:
    """The trtllm-serve command line; arguments after ``--`` on ours are passed through."""
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


def check_trtllm() -> None:
    """Raise :class:`LaunchError` unless TensorRT-LLM >= 1.2 and ``trtllm-serve`` are installed."""
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
    if shutil.which("trtllm-serve") is None:
        raise LaunchError(f"TensorRT-LLM {version} is installed but trtllm-serve is not on PATH")


def _shown_env(env: Mapping[str, str]) -> list[str]:
    shown = redacted({k: v for k, v in env.items() if k.startswith("SEMBLEND_") or k == "PYTHONPATH"})
    return [f"{k}={shown[k]}" for k in sorted(shown)]


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    cfg, text = launch_config(args, env)
    if args.command == "print-config" or args.print_config:
        sys.stdout.write(text)
        return 0
    child_env = launch_env(cfg, env)
    if args.dry_run:
        command = serve_command(args, args.engine_config_out or "<engine.yaml>")
        print("# command\n" + " ".join(command))
        print("# environment\n" + "\n".join(_shown_env(child_env)))
        print("# engine YAML\n" + text, end="")
        return 0
    check_trtllm()
    if args.engine_config_out:
        path = args.engine_config_out
        Path(path).write_text(text)
    else:
        fd, path = tempfile.mkstemp(prefix="semblend-engine-", suffix=".yaml")
        with os.fdopen(fd, "w") as f:
            f.write(text)
    command = serve_command(args, path)
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
