"""The process heap: glibc's thresholds bounded so a thread's arena gives its freed top back, and the trim."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from semblend_dynamo.router.heap import bound_heap_tops, trim_heap

GLIBC = getattr(ctypes.CDLL(None), "mallopt", None) is not None

# In a fresh interpreter (the thresholds are the process's): a 16 MiB block freed raises glibc's adaptive thresholds
# (as a large reply freed does in a router), then a new thread allocates and frees 24 MiB (less than the raised trim
# threshold) in 512 KiB blocks, which come from that thread's own arena. Prints the MiB still resident afterwards (a
# malloc_trim included: it does not give back the top of a thread's arena).
RETAINED = """
import ctypes, sys, threading
from semblend_dynamo.router.heap import bound_heap_tops, trim_heap
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] != "0":
    assert bound_heap_tops(int(sys.argv[1]) << 20)

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

def touch_and_free(sizes):
    blocks = [libc.malloc(size) for size in sizes]
    for block, size in zip(blocks, sizes):
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)

touch_and_free([16 << 20])
before = rss()
worker = threading.Thread(target=touch_and_free, args=([512 << 10] * 48,))
worker.start()
worker.join()
trim_heap()
print(rss() - before)
"""


def _retained_mib(limit_mib: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", RETAINED, str(limit_mib)], capture_output=True, text=True, timeout=60, check=True
    )
    return float(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_a_threads_freed_memory_goes_back_to_the_os_once_the_tops_are_bounded() -> None:
    assert _retained_mib(0) > 16  # glibc's own thresholds: the thread's arena keeps what it freed
    assert _retained_mib(4) < 6  # bounded at 4 MiB: at most about that much stays


def test_an_unbounded_heap_is_left_as_it_is_and_a_bad_limit_is_refused() -> None:
    assert bound_heap_tops(0) is False
    with pytest.raises(ValueError, match="heap top"):
        bound_heap_tops(-1)
    with pytest.raises(ValueError, match="heap top"):
        bound_heap_tops(64 << 20)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc_trim only")
def test_the_heap_is_trimmed_on_glibc() -> None:
    assert trim_heap() is True


def test_the_router_bounds_its_heap_at_start_as_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.router import __main__ as router_main

    bounds: list[int] = []

    async def serving(*_: object) -> int:
        return 0

    monkeypatch.setattr(router_main, "bound_heap_tops", bounds.append)
    monkeypatch.setattr(router_main, "_serve", serving)
    for cfg in (SemblendConfig(), SemblendConfig(heap_top_mib=0)):
        assert asyncio.run(router_main.serve(cfg)) == 0
    assert bounds == [4 << 20, 0]
