"""An isolation that is not in force refuses to start, with one line naming the fix (connector and launcher)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from semblend_dynamo.config import ConfigError, SemblendConfig
from trtllm_connector.connector import SemBlendConnectorScheduler
from trtllm_connector.harness import HarnessLlmArgs

SHIFTED = {"block_size": 8, "exact_materialization_only": False}


def test_connector_refuses_no_block_reuse_when_the_engine_reuses_blocks() -> None:
    cfg = SemblendConfig(**SHIFTED, isolation="no_block_reuse")
    with pytest.raises(ConfigError) as refused:
        SemBlendConnectorScheduler(HarnessLlmArgs(8, enable_block_reuse=True), config=cfg)
    message = str(refused.value)
    assert message.count("\n") == 0 and "enable_block_reuse: false" in message and "SEMBLEND_ISOLATION" in message
    SemBlendConnectorScheduler(HarnessLlmArgs(8, enable_block_reuse=False), config=cfg)  # in force: starts


def test_connector_reads_trtllm_default_block_reuse_as_on() -> None:
    args = HarnessLlmArgs(8)
    del args.kv_cache_config.enable_block_reuse  # an engine config without the field: TensorRT-LLM's default, True
    with pytest.raises(ConfigError, match="enable_block_reuse"):
        SemBlendConnectorScheduler(args, config=SemblendConfig(**SHIFTED, isolation="no_block_reuse"))


@pytest.mark.parametrize("isolation", ["none", "no_block_reuse"])
def test_launcher_dry_run_refuses_an_isolation_not_in_force(tmp_path: Path, isolation: str) -> None:
    user_yaml = tmp_path / "engine.yaml"
    user_yaml.write_text("kv_cache_config:\n  enable_block_reuse: true\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtllm_connector.launcher",
            "serve",
            "/models/m",
            "--mode",
            "shifted",
            "--isolation",
            isolation,
            "--extra-llm-api-options",
            str(user_yaml),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    names = {"none": "isolation", "no_block_reuse": "enable_block_reuse"}[isolation]  # the setting to change
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in done.stderr
