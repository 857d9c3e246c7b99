"""Arrays for large tables read at random, on memory the kernel may back with huge pages.

A span search reads one random line of its namespace's chunk filter per prompt window (~8K at 8K tokens) and a few
hundred random buckets of its id table; at 100K donors these are 8 MiB and 32 MiB. On 4 KiB pages nearly every read
also misses the TLB once the process has waited for others, and each miss walks page tables that are cold too. An
anonymous mapping advised ``MADV_HUGEPAGE`` and aligned to 2 MiB lets a kernel with transparent huge pages in
``madvise`` or ``always`` mode map it in 2 MiB pages (a few TLB entries for the whole table). Where the kernel does
not (``never``, no huge page free, not Linux), the mapping is ordinary memory: same contents, no error.
"""

from __future__ import annotations

import contextlib
import mmap

import numpy as np
from numpy.typing import DTypeLike

HUGE_PAGE = 2 << 20
MIN_BYTES = HUGE_PAGE  # smaller arrays are numpy's own: at most one huge page to gain
_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)


def zeros(shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """A zeroed, writeable C-contiguous array; from ``MIN_BYTES`` on, on its own mapping starting on a 2 MiB
    boundary (the array keeps the mapping alive)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.zeros(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE)  # anonymous: zeroed, faulted in on first touch
    if _ADVICE is not None:
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages: plain pages
            mapping.madvise(_ADVICE)
    raw = np.frombuffer(mapping, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def full(shape: tuple[int, ...], value: int, dtype: DTypeLike) -> np.ndarray:
    """:func:`zeros`, filled with ``value``."""
    out = zeros(shape, dtype)
    if value:
        out.fill(value)
    return out
