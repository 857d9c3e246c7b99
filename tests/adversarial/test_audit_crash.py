"""The audit under kill -9: at most the record being written lost (a torn line of its own, skipped by readers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from semblend_dynamo.audit import AuditWriter, read_audit

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
    parsed, torn = [], 0
    for line in path.read_bytes().decode().splitlines():
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:  # the record a kill cut short: the last of its run, never merged with the next
            assert not parsed or torn < len([r for r in parsed if r["request_id"] == "0"])
            torn += 1
    assert torn <= 3
    assert len(parsed) >= 3 * 200
    ids = [int(r["request_id"]) for r in parsed]
    runs = [i for i, rid in enumerate(ids) if rid == 0]
    assert len(runs) == 3  # each run's records are contiguous, numbered without gaps
    for start, end in zip(runs, [*runs[1:], len(ids)], strict=True):
        assert ids[start:end] == list(range(end - start))


def test_a_writer_ends_a_torn_line_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"event":"lookup","ts":1.0,"run_id":"a","request_id":"7"}\n{"event":"loo')  # killed mid-line
    with AuditWriter(path) as writer:
        writer.write(event="lookup", request_id="8", found=True)
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == b'{"event":"loo' and lines[-1] == b""  # the torn line stays on its own
    assert [r["request_id"] for r in read_audit(path)] == ["7", "8"]  # nothing after it is lost


def test_a_writer_adds_nothing_to_a_whole_or_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for expected_lines in (1, 2):
        with AuditWriter(path) as writer:
            writer.write(event="lookup", request_id="1", found=True)
        assert path.read_bytes().count(b"\n") == expected_lines
        assert all(path.read_bytes().split(b"\n")[:-1])  # no empty line
