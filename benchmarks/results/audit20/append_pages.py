"""The audit's ``os.write`` on its own: appends of one decision's lines, those that start a new page of the file apart.

``python benchmarks/results/audit20/append_pages.py [N] [SIZE]``: N appends of SIZE bytes (default 3,000 of 621, the
connector's two records of a shifted hit) to a fresh file opened as ``AuditWriter`` opens it, with nothing, a 200 µs
spin, a 4 MB sweep, a 200 µs sleep, or a list of 8,192 ints made and freed (what a decision's prompt read does)
between them; and the same appends into blocks reserved ahead with ``fallocate(FALLOC_FL_KEEP_SIZE)`` (the file's size
unchanged). Prints median / p90 µs of the appends that cross into a new page and of those that stay within one.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

ns = time.perf_counter_ns
libc = ctypes.CDLL(None, use_errno=True)
SWEPT = np.zeros(4 << 20, np.uint8)


def run(label: str, between: Callable[[], None], n: int, size: int, reserve: bool = False) -> None:
    path = os.path.join(tempfile.mkdtemp(), "audit.jsonl")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    if reserve:
        assert libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(64 << 20)) == 0  # FALLOC_FL_KEEP_SIZE
    data = b"x" * (size - 1) + b"\n"
    cross: list[int] = []
    inside: list[int] = []
    offset = 0
    for _ in range(n):
        between()
        t0 = ns()
        os.write(fd, data)
        t1 = ns()
        (cross if offset // 4096 != (offset + size - 1) // 4096 else inside).append(t1 - t0)
        offset += size
    os.close(fd)
    os.unlink(path)

    def q(v: list[int], p: float) -> float:
        return sorted(v)[int(len(v) * p)] / 1e3

    print(
        f"{label:26s} new page: n={len(cross):4d} p50 {q(cross, 0.5):6.2f} p90 {q(cross, 0.9):6.2f}"
        f" | within a page: p50 {q(inside, 0.5):5.2f} p90 {q(inside, 0.9):5.2f}",
        flush=True,
    )


def nothing() -> None:
    pass


def spin() -> None:
    end = ns() + 200_000
    while ns() < end:
        pass


def sweep() -> None:
    SWEPT[::64] += 1


def sleep() -> None:
    time.sleep(0.0002)


def ints() -> None:
    tokens = list(range(100_000, 108_192))
    del tokens


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 621
    for _ in range(2):
        for label, between in (
            ("nothing", nothing),
            ("spin 200 us", spin),
            ("sweep 4 MB", sweep),
            ("sleep 200 us", sleep),
            ("8K ints made and freed", ints),
        ):
            run(label, between, n, size)
        run("8K ints, blocks reserved", ints, n, size, reserve=True)


if __name__ == "__main__":
    main()
