from __future__ import annotations

import argparse

import pytest

from semblend_dynamo.config import (
    ConfigError,
    SemblendConfig,
    add_config_arguments,
    config_from_args,
    env_name,
)


def test_defaults_are_the_safe_ones() -> None:
    cfg = SemblendConfig.load(env={})
    assert cfg.enabled and cfg.exact_materialization_only and cfg.strict_prefix_boundary
    assert not cfg.discovery_only and not cfg.fuzzy_chunks
    assert cfg.min_similarity == pytest.approx(0.60)
    assert cfg.mode == "exact"


def test_env_names_match_design() -> None:
    for var in [
        "SEMBLEND_ENABLED",
        "SEMBLEND_MIN_SIMILARITY",
        "SEMBLEND_EMBEDDER",
        "SEMBLEND_FUZZY_CHUNKS",
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
