"""The process's heap: how much freed memory glibc may keep, and handing what it keeps back to the OS.

glibc gives each thread that allocates an arena of its own (up to eight a core), and adapts two thresholds to the
largest block freed so far, up to 32 MiB: blocks above the *mmap threshold* are mapped on their own and unmapped when
freed, and an arena keeps up to the *trim threshold* (twice it) of free memory at its top. ``malloc_trim`` hands back
free pages inside every arena and the main heap's top, but not the top of a thread's arena. So after a large reply
raised them, every thread that built one (a snapshot's save in an executor thread, the indexer, Dynamo's runtime) could
keep up to 64 MiB no trim returns: a serving replica grew by 33-94 MiB for each sync it served at 1M donors.
:func:`bound_heap_tops` fixes both thresholds instead; :func:`trim_heap` hands back the rest.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MAX_HEAP_TOP = 32 << 20
"""glibc refuses a larger mmap threshold (half its thread heaps' 64 MiB)."""


def bound_heap_tops(limit: int) -> bool:
    """Fix glibc's mmap and trim thresholds at ``limit`` bytes (0: keep its adaptive ones). Then a block of ``limit``
    or more is mapped on its own, and no arena keeps more than ``limit`` free at its top. For the whole process,
    threads started later included. False where nothing changed (0, or a C library without ``mallopt``)."""
    if not 0 <= limit <= MAX_HEAP_TOP:
        raise ValueError(f"heap top of {limit} bytes: expected 0 to {MAX_HEAP_TOP}")
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the process's own symbols: no library search
    if not limit or mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, limit)) and bool(mallopt(M_TRIM_THRESHOLD, limit))


def trim_heap() -> bool:
    """Hand the heap's free memory back to the OS (glibc's ``malloc_trim(0)``, without the GIL); False where the C
    library has no ``malloc_trim``."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is None:
        return False
    trim(ctypes.c_size_t(0))
    return True
