"""Helpers for the subprocesses tests start (nats-server, Dynamo test workers, routers)."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; a process that already exited is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
