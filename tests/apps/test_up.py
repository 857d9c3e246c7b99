"""``semblend-dynamo up`` as a user runs it: a subprocess, the URL line, traffic, the router's table, SIGTERM."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from semblend_apps import cli, up
from semblend_apps.replay.http_target import format_target_report, run_target
from semblend_apps.up import LocalGraph, UpConfig, UpError

pytestmark = [pytest.mark.dynamo, pytest.mark.nats]
ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _read_banner(proc: subprocess.Popen[str], timeout: float = 120.0) -> dict[str, str]:
    """Lines of the ready banner up to ``pids:``, keyed by their label."""
    assert proc.stdout is not None
    lines: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(
                f"up exited {proc.wait()} before its banner: {proc.stderr.read() if proc.stderr else ''}"
            )
        label, _, rest = line.partition(": ")
        lines[label] = rest.strip()
        if label == "pids":
            return lines
    raise AssertionError("no banner within the timeout")


def test_up_serves_the_workload_and_stops_every_process_on_sigterm(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "semblend_apps.cli", "up", "--workers", "2", "--embedder", "hash"]
    cmd += ["--workdir", str(tmp_path / "graph")]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: dict[str, int] = {}
    try:
        banner = _read_banner(proc)
        pids = {name: int(pid) for name, pid in (p.split("=") for p in banner["pids"].split())}
        assert set(pids) == {"nats", "mocker0", "mocker1", "router", "frontend"}
        url = re.fullmatch(r"(http://127\.0\.0\.1:\d+)/v1", banner["OpenAI URL"])
        metrics = re.fullmatch(r"(http://127\.0\.0\.1:\d+)/metrics", banner["router metrics"])
        assert url and metrics, banner

        report = run_target(url[1], router_metrics=metrics[1], model=None, block_size=16, units=1, seed=0)

        assert report.model == "semblend-demo"
        served = report.http_status.get("200", 0)
        assert served == report.sent - 1  # the one empty prompt is refused by the Frontend (400)
        assert report.http_status.get("400") == 1
        # the router recorded every request that reached it, and routed the exact repeat as a prefix match
        assert sum(report.router_outcomes.values()) == served
        assert report.router_outcomes.get("exact_prefix_route", 0) >= 1
        assert report.requests_by_kind["exact_repeat"] == 1
        assert report.cached_tokens_by_kind["exact_repeat"] > 0
        table = format_target_report(report)
        assert "router outcomes" in table and "exact_prefix_route" in table
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
    assert rc == 0
    deadline = time.monotonic() + 5.0
    while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [name for name, pid in pids.items() if _alive(pid)]


def test_up_without_nats_server_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(up, "find_nats_server", lambda: None)
    assert cli.main(["up", "--workdir", str(tmp_path / "graph")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "semblend-dynamo up: nats-server not found on PATH: install it (scripts/bootstrap.sh) or pass --nats-url"
    ]


def test_up_without_dynamo_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "dynamo.mocker" else real(name))
    assert cli.main(["up", "--workdir", str(tmp_path / "graph")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("semblend-dynamo up: dynamo.mocker is not installed: run scripts/bootstrap.sh")


def test_up_with_an_unreachable_nats_url_fails_before_starting_anything(tmp_path: Path) -> None:
    graph = LocalGraph(UpConfig(nats_url=f"nats://127.0.0.1:{up.free_port()}", workdir=tmp_path / "graph"))
    with pytest.raises(UpError, match="nothing listening"):
        graph.start()
    assert graph.children == []
