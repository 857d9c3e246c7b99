"""Router start-up and shutdown: one line naming the setting instead of Dynamo's long waits, SIGTERM honoured at
every stage, JSON logs on request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from semblend_dynamo.router.preflight import StartupError, check_discovery
from tests.support.nats import NatsServer, free_port, nats_binary

ROOT = Path(__file__).resolve().parents[2]


def test_discovery_check_names_the_setting(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StartupError, match=f"ETCD_ENDPOINTS={dead}"):
        check_discovery({"ETCD_ENDPOINTS": dead})  # etcd is Dynamo's default backend
    with pytest.raises(StartupError, match="DYN_DISCOVERY_BACKEND='consul'"):
        check_discovery({"DYN_DISCOVERY_BACKEND": "consul"})
    with pytest.raises(StartupError, match="KUBERNETES_SERVICE_HOST"):
        check_discovery({"DYN_DISCOVERY_BACKEND": "kubernetes"})
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StartupError, match="DYN_FILE_KV="):
        check_discovery({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(blocker / "kv")})
    assert check_discovery({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv")}) == "file"


def _router(env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "semblend_dynamo.router"]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "SEMBLEND_", "ETCD_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.dynamo
@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"ETCD_ENDPOINTS": "http://127.0.0.1:{port}"}, "ETCD_ENDPOINTS=http://127.0.0.1:"),
        ({"DYN_DISCOVERY_BACKEND": "file", "DYN_EVENT_PLANE": "kafka"}, "DYN_EVENT_PLANE='kafka'"),
    ],
)
def test_unusable_setting_gives_one_line_naming_it(settings: dict[str, str], named: str) -> None:
    env = _base_env() | {k: v.format(port=free_port()) for k, v in settings.items()}
    proc = _router(env)
    out, _ = proc.communicate(timeout=10)  # Dynamo alone waits ~120 s for etcd, then raises a traceback
    assert proc.returncode == 2
    assert out.strip().count("\n") == 0 and named in out and "Traceback" not in out, out


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    if nats_binary() is None:
        pytest.fail("nats-server is missing: scripts/bootstrap.sh dev installs it")
    with NatsServer() as server:
        yield server.url


@pytest.mark.dynamo
@pytest.mark.nats
@pytest.mark.parametrize("stage", ["importing", "starting", "serving"])
def test_sigterm_is_honoured_at_every_stage(stage: str, nats_url: str, tmp_path: Path) -> None:
    env = _base_env() | {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE": "nats",
        "NATS_SERVER": nats_url,
        "SEMBLEND_NATS_URL": nats_url,
        "SEMBLEND_DYNAMO_NAMESPACE": f"sig{os.getpid()}",
        "SEMBLEND_EMBEDDER": "hash",
        "SEMBLEND_LOG_FORMAT": "json",
    }
    proc = _router(env)
    assert proc.stdout is not None
    lines = []
    if stage == "importing":
        time.sleep(0.2)
    else:  # "starting": the first line of start-up (the runtime, the model card ... follow); "serving": ready
        marker = "router starting" if stage == "starting" else "SEMBLEND_ROUTER_READY"
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                break
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rest, _ = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - t0
    print(f"SIGTERM while {stage}: exited after {took:.2f}s, rc {proc.returncode}")
    out = "".join(lines) + rest
    assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in out, out
    if stage == "serving":  # our log lines are JSON objects (Dynamo's own lines: DYN_LOGGING_JSONL=1)
        ours = [json.loads(line) for line in out.splitlines() if line.startswith('{"ts"')]
        assert any(r["logger"] == "semblend_dynamo.router" and "serving" in r["msg"] for r in ours), out
        assert all({"ts", "level", "logger", "msg"} <= set(r) for r in ours)
