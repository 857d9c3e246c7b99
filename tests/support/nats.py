"""A real nats-server started by the tests on a free 127.0.0.1 port (never the machine's own 4222)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time

from tests.support.processes import stop_process


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_binary() -> str | None:
    return shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.access("/usr/sbin/nats-server", os.X_OK) else None
    )


class NatsServer:
    """Owns one nats-server process; can be stopped and restarted on the same port."""

    def __init__(self, port: int | None = None, jetstream: bool = False) -> None:
        binary = nats_binary()
        if binary is None:
            raise RuntimeError("nats-server not found; run scripts/bootstrap.sh dev")
        self.binary = binary
        self.port = port or free_port()
        self.jetstream = jetstream
        self.store = tempfile.mkdtemp(prefix="semblend-nats-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        cmd = [self.binary, "-a", "127.0.0.1", "-p", str(self.port)]
        if self.jetstream:
            cmd += ["-js", "-sd", self.store]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError(f"nats-server did not listen on 127.0.0.1:{self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.store, ignore_errors=True)
