"""The semblend-trtllm launcher: dry run, print-config, YAML merge rules, and the missing-TensorRT-LLM error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtllm_connector import launcher
from trtllm_connector.engine_config import EngineConfigSettings, render_engine_yaml


def _run(capsys: pytest.CaptureFixture[str], *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env or {})
    try:
        rc = launcher.main(list(argv))
    finally:
        os.environ.clear()
        os.environ.update(old)
    out, err = capsys.readouterr()
    return rc, out, err


def _sections(out: str) -> dict[str, str]:
    parts: dict[str, list[str]] = {}
    current = ""
    for line in out.splitlines():
        if line in ("# preflight", "# command", "# environment", "# engine YAML"):
            current = line[2:]
            parts[current] = []
        else:
            parts[current].append(line)
    return {k: "\n".join(v) for k, v in parts.items()}


def test_dry_run_prints_command_env_and_yaml(capsys) -> None:
    rc, out, err = _run(
        capsys, "serve", "org/model", "--port", "9001", "--mode", "shifted", "--isolation", "no_block_reuse",
        "--block-size", "16", "--nats-password", "hunter2", "--dry-run", "--", "--tp_size", "2",
    )  # fmt: skip
    assert rc == 0 and err == ""
    s = _sections(out)
    assert s["command"].split() == [
        "trtllm-serve", "org/model", "--host", "127.0.0.1", "--port", "9001", "--backend", "pytorch",
        "--extra_llm_api_options", "<engine.yaml>", "--tp_size", "2",
    ]  # fmt: skip
    env = dict(line.split("=", 1) for line in s["environment"].splitlines())
    assert env["SEMBLEND_EXACT_MATERIALIZATION_ONLY"] == "0" and env["SEMBLEND_ISOLATION"] == "no_block_reuse"
    assert env["SEMBLEND_BLOCK_SIZE"] == "16" and env["SEMBLEND_MODEL_ID"] == "org/model"
    assert env["SEMBLEND_NATS_PASSWORD"] == "***" and "hunter2" not in out
    assert str(Path(launcher.__file__).resolve().parent.parent) in env["PYTHONPATH"].split(os.pathsep)
    expected = render_engine_yaml(EngineConfigSettings(mode="shifted", isolation="no_block_reuse", tokens_per_block=16))
    assert s["engine YAML"] + "\n" == expected
    assert yaml.safe_load(expected)["kv_cache_config"]["enable_block_reuse"] is False


def test_print_config_is_only_the_engine_yaml(capsys) -> None:
    rc, out, _ = _run(capsys, "print-config", "--mode", "discovery_only")
    assert rc == 0 and out == render_engine_yaml(EngineConfigSettings(mode="discovery_only"))
    rc2, out2, _ = _run(capsys, "serve", "m", "--print-config", "--mode", "discovery_only")
    assert rc2 == 0 and out2 == out


def test_env_settings_reach_the_yaml(capsys) -> None:
    rc, out, _ = _run(capsys, "print-config", env={"SEMBLEND_BLOCK_SIZE": "64"})
    assert rc == 0 and yaml.safe_load(out)["kv_cache_config"]["tokens_per_block"] == 64


def test_user_yaml_is_merged_but_cannot_change_safety_keys(capsys, tmp_path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text("max_batch_size: 8\nkv_cache_config:\n  free_gpu_memory_fraction: 0.5\n  host_cache_size: 1024\n")
    rc, out, _ = _run(capsys, "print-config", "--extra-llm-api-options", str(user))
    merged = yaml.safe_load(out)
    assert rc == 0 and merged["max_batch_size"] == 8
    assert merged["kv_cache_config"]["free_gpu_memory_fraction"] == 0.5
    assert merged["kv_cache_config"]["enable_partial_reuse"] is False
    assert merged["kv_connector_config"]["connector_module"] == "trtllm_connector.connector"
    user.write_text("kv_cache_config:\n  enable_partial_reuse: true\n")
    rc, out, err = _run(capsys, "print-config", "--extra-llm-api-options", str(user))
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "enable_partial_reuse" in err
    user.write_text("kv_connector_config:\n  connector_module: lmcache.integration\n")
    rc, out, err = _run(capsys, "print-config", "--extra-llm-api-options", str(user))
    assert rc == 0 and "kv_connector_config" in err and "replaced" in err
    assert (
        yaml.safe_load(out)["kv_connector_config"]
        == yaml.safe_load(render_engine_yaml(EngineConfigSettings()))["kv_connector_config"]
    )


def test_shifted_without_isolation_is_one_line_error(capsys) -> None:
    rc, out, err = _run(capsys, "serve", "m", "--mode", "shifted", "--dry-run")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "isolation" in err


def test_real_run_without_tensorrt_llm_exits_with_one_line(tmp_path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtllm_connector.launcher",
            "serve",
            "m",
            "--engine-config-out",
            str(tmp_path / "e.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert proc.returncode != 0 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("semblend-trtllm: TensorRT-LLM is not installed")
    assert not (tmp_path / "e.yaml").exists()


def test_too_old_tensorrt_llm_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(launcher.importlib.metadata, "version", lambda name: "1.1.0")
    with pytest.raises(launcher.LaunchError, match=r"1\.1\.0 is too old"):
        launcher.check_trtllm()


@pytest.mark.parametrize("spelling", ["--extra_llm_api_options", "--extra-llm-api-options", "--extra-engine-args"])
def test_every_spelling_of_the_user_yaml_merges_in_a_dry_run(capsys, tmp_path, spelling) -> None:
    user = tmp_path / "x.yaml"
    user.write_text("max_batch_size: 4\nkv_cache_config:\n  tokens_per_block: 32\n  host_cache_size: 2048\n")
    rc, out, err = _run(capsys, "serve", "org/model", spelling, str(user), "--dry-run")
    assert rc == 0 and err == ""
    merged = yaml.safe_load(_sections(out)["engine YAML"])
    assert merged["max_batch_size"] == 4 and merged["kv_cache_config"]["host_cache_size"] == 2048
    assert merged["kv_cache_config"]["enable_block_reuse"] is True
    assert merged["kv_connector_config"]["connector_module"] == "trtllm_connector.connector"


def test_dynamo_target_runs_the_worker_as_the_chart_does(capsys) -> None:
    rc, out, err = _run(
        capsys, "serve", "Qwen/Qwen3-0.6B", "--target", "dynamo", "--block-size", "16", "--dynamo-namespace",
        "prod-workers", "--nats-url", "nats://nats.dynamo:4222", "--dry-run", "--", "--tensor-parallel-size", "2",
    )  # fmt: skip
    assert rc == 0 and err == ""
    s = _sections(out)
    assert s["command"].split() == [
        "python3", "-m", "dynamo.trtllm", "--model-path", "Qwen/Qwen3-0.6B", "--served-model-name", "Qwen/Qwen3-0.6B",
        "--extra-engine-args", "<engine.yaml>", "--publish-events-and-metrics", "--kv-block-size", "16",
        "--endpoint", "dyn://prod-workers.backend.generate", "--tensor-parallel-size", "2",
    ]  # fmt: skip
    env = dict(line.split("=", 1) for line in s["environment"].splitlines())
    assert env["DYN_EVENT_PLANE"] == "nats" and env["NATS_SERVER"] == "nats://nats.dynamo:4222"
    assert env["DYN_NAMESPACE"] == "prod-workers" and env["SEMBLEND_CONNECTOR_NATS"] == "1"
    assert yaml.safe_load(s["engine YAML"])["kv_cache_config"]["tokens_per_block"] == 16
    assert len(s["preflight"].splitlines()) >= 1


def _all_actions(parser):
    for action in parser._actions:
        if isinstance(action, launcher.argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)
        elif not isinstance(action, launcher.argparse._HelpAction):
            yield parser.prog, action


def test_every_flag_has_help() -> None:
    missing = [(prog, a.dest) for prog, a in _all_actions(launcher.build_parser()) if not a.help]
    assert missing == []


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["serve", "m", "--no-such-flag", "--dry-run"], "--no-such-flag"),
        (["serve", "m", "--port", "http", "--dry-run"], "--port"),
        (["serve", "m", "--target", "vllm", "--dry-run"], "--target"),
        (["serve", "m", "--extra_llm_api_options", "/nonexistent/x.yaml", "--dry-run"], "/nonexistent/x.yaml"),
        (["serve", "m", "--min-similarity", "2", "--dry-run"], "SEMBLEND_MIN_SIMILARITY"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trtllm_connector.launcher", *argv], capture_output=True, text=True, timeout=60
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1 and needle in lines[0], proc.stderr
