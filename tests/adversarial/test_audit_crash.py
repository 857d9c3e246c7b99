"""The audit under kill -9: at most the last record lost, never a partial line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WRITER = """
import sys
from semblend_dynamo.audit import AuditWriter
w = AuditWriter(sys.argv[1])
i = 0
while True:
    w.write(event="lookup", request_id=str(i), found=bool(i % 2), detail="x" * (i % 300))
    i += 1
    if i == 200:
        print("ready", flush=True)
"""


def test_audit_survives_sigkill_with_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for _ in range(3):  # three crashes appending to one file
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
    data = path.read_bytes()
    assert data.endswith(b"\n")  # no partial last line
    lines = data.decode().splitlines()
    parsed = [json.loads(line) for line in lines]  # every line is a whole record
    assert len(parsed) >= 3 * 200
    ids = [int(r["request_id"]) for r in parsed]
    runs = [i for i, rid in enumerate(ids) if rid == 0]
    assert len(runs) == 3  # each run's records are contiguous, numbered without gaps
    for start, end in zip(runs, [*runs[1:], len(ids)], strict=True):
        assert ids[start:end] == list(range(end - start))
