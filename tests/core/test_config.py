from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from semblend_dynamo.config import (
    NON_SETTING_VARIABLES,
    ConfigError,
    SemblendConfig,
    add_config_arguments,
    config_from_args,
    env_name,
)


def test_defaults_are_the_safe_ones() -> None:
    cfg = SemblendConfig.load(env={})
    assert cfg.enabled and cfg.exact_materialization_only and cfg.strict_prefix_boundary
    assert not cfg.discovery_only
    assert cfg.min_similarity == pytest.approx(0.60)
    assert cfg.mode == "exact"


def test_env_names_match_design() -> None:
    for var in [
        "SEMBLEND_ENABLED",
        "SEMBLEND_MIN_SIMILARITY",
        "SEMBLEND_EMBEDDER",
        "SEMBLEND_DISCOVERY_ONLY",
        "SEMBLEND_STRICT_PREFIX_BOUNDARY",
        "SEMBLEND_EXACT_MATERIALIZATION_ONLY",
    ]:
        assert var in {env_name(n) for n in SemblendConfig.model_fields}


def test_precedence_yaml_env_cli(tmp_path) -> None:
    y = tmp_path / "c.yaml"
    y.write_text("min_similarity: 0.7\nSEMBLEND_MAX_SPANS: 3\nblock_size: 16\n")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(["--config", str(y), "--block-size", "64"])
    cfg = config_from_args(args, env={"SEMBLEND_MIN_SIMILARITY": "0.8"})
    assert cfg.min_similarity == pytest.approx(0.8)  # env beats YAML
    assert cfg.max_spans == 3  # YAML, env-style key
    assert cfg.block_size == 64  # CLI beats YAML


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SEMBLEND_MIN_SIMILARITY": "1.5"}, "SEMBLEND_MIN_SIMILARITY='1.5'"),
        ({"SEMBLEND_ENABLED": "maybe"}, "SEMBLEND_ENABLED='maybe'"),
        ({"SEMBLEND_EMBEDDER": "bert"}, "'minilm' or 'hash'"),
        ({"SEMBLEND_BLOCK_SIZE": "-4"}, "SEMBLEND_BLOCK_SIZE='-4'"),
        ({"SEMBLEND_WINDOW_TOKENS": "64", "SEMBLEND_WINDOW_OVERLAP": "64"}, "SEMBLEND_WINDOW_OVERLAP"),
        ({"SEMBLEND_EXACT_MATERIALIZATION_ONLY": "0"}, "requires isolation: set SEMBLEND_ISOLATION"),
        ({"SEMBLEND_ROPE_CONFIG": "{oops"}, "SEMBLEND_ROPE_CONFIG"),
    ],
)
def test_bad_values_name_variable_value_and_allowed(env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        SemblendConfig.load(env=env)
    assert needle in str(err.value)


def test_corrupt_and_unknown_yaml(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("min_similarity: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        SemblendConfig.load(env={}, yaml_path=bad)
    unk = tmp_path / "unk.yaml"
    unk.write_text("min_similarityy: 0.5\n")
    with pytest.raises(ConfigError, match="SEMBLEND_MIN_SIMILARITYY"):
        SemblendConfig.load(env={}, yaml_path=unk)
    with pytest.raises(ConfigError, match="cannot read"):
        SemblendConfig.load(env={}, yaml_path=tmp_path / "missing.yaml")


def test_to_env_round_trips() -> None:
    cfg = SemblendConfig.load(env={"SEMBLEND_DISCOVERY_ONLY": "1", "SEMBLEND_MIN_SIMILARITY": "0.75"})
    again = SemblendConfig.load(env=cfg.to_env())
    assert again == cfg
    assert again.mode == "discovery_only"


def test_config_command_never_prints_secrets(capsys) -> None:
    from semblend_apps.cli import main

    for fmt in ("env", "yaml", "json"):
        rc = main(["config", "--format", fmt, "--nats-password", "hunter2", "--nats-token", "tok-123"])
        out = capsys.readouterr().out
        assert rc == 0 and "hunter2" not in out and "tok-123" not in out
        assert "***" in out


def test_unknown_environment_variable_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"SEMBLEND_MIN_SIMILARTY \(did you mean SEMBLEND_MIN_SIMILARITY\?\)"):
        SemblendConfig.load(env={"SEMBLEND_MIN_SIMILARTY": "0.7"})
    with pytest.raises(ConfigError, match="unknown variable SEMBLEND_NO_SUCH_THING; unset it"):
        SemblendConfig.load(env={"SEMBLEND_NO_SUCH_THING": "1"})
    # variables that are not settings, and variables of other programs, are left alone
    env = {"SEMBLEND_LOG_LEVEL": "DEBUG", "SEMBLEND_KEEP_TEST_LOGS": "1", "NATS_SERVER": "nats://x:4222"}
    assert SemblendConfig.load(env=env) == SemblendConfig()


def test_every_semblend_variable_the_repo_uses_is_known() -> None:
    """Charts, scripts, docs and tests only set variables that load() accepts."""
    repo = Path(__file__).resolve().parents[2]
    used: set[str] = set()
    for folder in ("semblend_dynamo", "semblend_apps", "trtllm_connector", "deploy", "docs", "scripts", "tests"):
        for path in (repo / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".md", ".yaml", ".tpl", ".json", ".sh"}:
                used |= set(re.findall(r"SEMBLEND_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="ignore")))
    known = {env_name(n) for n in SemblendConfig.model_fields} | set(NON_SETTING_VARIABLES)
    typos_under_test = {"SEMBLEND_MIN_SIMILARITYY", "SEMBLEND_MIN_SIMILARTY", "SEMBLEND_NO_SUCH_THING"}
    printed_markers = {"SEMBLEND_ROUTER_READY"}  # a line the router prints when it serves, not a variable
    assert used - known - typos_under_test - printed_markers == set()


def test_unknown_yaml_key_suggests_the_setting(tmp_path) -> None:
    unk = tmp_path / "unk.yaml"
    unk.write_text("min_simlarity: 0.5\n")
    with pytest.raises(ConfigError, match="did you mean SEMBLEND_MIN_SIMILARITY"):
        SemblendConfig.load(env={}, yaml_path=unk)
