"""Every user error of ``semblend-dynamo`` is one line on stderr naming the setting, with exit code 2."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from semblend_apps.cli import main
from semblend_dynamo.config import SETTING_GROUPS, SemblendConfig, flag_name


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``main(args)`` in-process: its exit code and stderr (an exception escaping main fails the test)."""
    try:
        rc = main(list(args))
    except SystemExit as exc:  # argparse exits on bad flags
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


def assert_one_line_error(rc: int, err: str, needle: str) -> None:
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert needle in err, err


def bad_paths(tmp_path: Path) -> dict[str, list[tuple[str, str]]]:
    """Per path setting: values that cannot work, each with the text its error must contain."""
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    return {
        "audit_path": [
            (str(tmp_path), "is a directory"),
            (str(tmp_path / "bad.json" / "a.jsonl"), "not a directory"),
            ("/proc/semblend/a.jsonl", "cannot create"),
        ],
        "tokenizer": [(str(tmp_path / "missing.json"), "does not exist"), (str(tmp_path), "not a file")],
        "rope_config": [
            ("{bad", "not valid JSON"),
            ("[1, 2]", "does not exist"),
            ('{"rope_theta": 10000', "not valid JSON"),
            (str(tmp_path / "bad.json"), "not valid JSON"),
            (str(tmp_path / "list.json"), "JSON object"),
            (str(tmp_path / "missing.json"), "does not exist"),
        ],
        "nats_creds_file": [(str(tmp_path / "missing.creds"), "does not exist")],
        "onnx_cache_dir": [(str(tmp_path / "bad.json"), "not a directory")],
    }


@pytest.mark.parametrize("command", ["config", "replay"])
@pytest.mark.parametrize("setting", ["audit_path", "tokenizer", "rope_config", "nats_creds_file", "onnx_cache_dir"])
def test_bad_files_are_one_line_naming_the_setting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, setting: str
) -> None:
    for value, needle in bad_paths(tmp_path)[setting]:
        if command == "config":  # as a flag
            rc, err = run_cli(capsys, command, flag_name(setting), value)
        else:  # as a variable
            with pytest.MonkeyPatch.context() as env:
                env.setenv(f"SEMBLEND_{setting.upper()}", value)
                rc, err = run_cli(capsys, command, "--embedder", "hash")
        assert_one_line_error(rc, err, needle)
        assert f"SEMBLEND_{setting.upper()}" in err


def test_shifted_without_isolation_is_refused_by_config(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = run_cli(capsys, "config", "--exact-materialization-only", "0")
    assert_one_line_error(rc, err, "SEMBLEND_ISOLATION")
    assert "Value error" not in err
    rc, _ = run_cli(capsys, "config", "--exact-materialization-only", "0", "--isolation", "cache_salt")
    assert rc == 0
    # discovery_only never materializes, so it needs no isolation
    assert run_cli(capsys, "config", "--exact-materialization-only", "0", "--discovery-only", "1")[0] == 0


def _typed_settings() -> list[str]:
    """Settings whose type rejects the word ``bogus`` (numbers, booleans, choices)."""
    out = []
    for name, field in SemblendConfig.model_fields.items():
        kind = field.annotation
        if kind in (int, float, bool) or typing.get_origin(kind) is typing.Literal or name == "index_backend":
            out.append(name)
    return out


@pytest.mark.parametrize("setting", _typed_settings())
def test_every_typed_flag_rejects_nonsense_in_one_line(capsys: pytest.CaptureFixture[str], setting: str) -> None:
    rc, err = run_cli(capsys, "config", flag_name(setting), "bogus")
    assert_one_line_error(rc, err, "'bogus'")
    assert f"SEMBLEND_{setting.upper()}" in err or f"{flag_name(setting)}=" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["replay", "--units", "0"], "--units"),
        (["replay", "--units", "many"], "--units"),
        (["replay", "--seed", "x"], "--seed"),
        (["replay", "--backend", "gpu"], "--backend"),
        (["config", "--format", "toml"], "--format"),
        (["config", "--no-such-flag", "1"], "--no-such-flag"),
        (["nosuchcommand"], "nosuchcommand"),
        (["config", "--config", "/nonexistent/semblend.yaml"], "SEMBLEND_CONFIG"),
        (["router", "--min-similarity", "2"], "SEMBLEND_MIN_SIMILARITY"),
        (["router", "--tokenizer", "/nonexistent/tokenizer.json"], "SEMBLEND_TOKENIZER"),
        (["router", "--log-level", "LOUD"], "--log-level"),
        (["up", "--workers", "0"], "--workers"),
        (["up", "--http-port", "99999"], "--http-port"),
        (["up", "--workdir", "/proc/semblend/up"], "--workdir"),
    ],
)
def test_bad_flags_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    assert_one_line_error(*run_cli(capsys, *args), needle)


def test_corrupt_tokenizer_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not a tokenizer")
    rc, err = run_cli(capsys, "replay", "--backend", "none", "--embedder", "hash", "--tokenizer", str(bad))
    assert_one_line_error(rc, err, "SEMBLEND_TOKENIZER")


def test_bad_environment_values_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEMBLEND_AUDIT_PATH", "/proc/semblend/a.jsonl")
    assert_one_line_error(*run_cli(capsys, "config"), "SEMBLEND_AUDIT_PATH")


def test_bad_router_log_level_variable_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEMBLEND_LOG_LEVEL", "loud")
    assert_one_line_error(*run_cli(capsys, "router"), "SEMBLEND_LOG_LEVEL")


def test_every_setting_is_in_exactly_one_help_group() -> None:
    grouped = [name for names in SETTING_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(SemblendConfig.model_fields)


@pytest.mark.parametrize(
    ("command", "shown", "hidden"),
    [
        ("replay", ["modes settings:", "--audit-path", "--pin-ttl-s"], ["--nats-url", "--metrics-port"]),
        ("router", ["NATS settings:", "--nats-url", "Dynamo router settings:"], ["--audit-path", "--pin-ttl-s"]),
        ("config", ["--nats-url", "--audit-path", "--pin-ttl-s"], []),
    ],
)
def test_subcommand_help_shows_its_own_settings_grouped_with_examples(
    capsys: pytest.CaptureFixture[str], command: str, shown: list[str], hidden: list[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"semblend-dynamo {command}" in out.split("examples:")[1]
    for text in shown:
        assert text in out
    for text in hidden:
        assert text not in out
    assert "SEMBLEND_MIN_SIMILARITY)" in out  # the variable is named in the help text ...
    assert " SEMBLEND_" not in out.split("options:")[0]  # ... never as a metavar
