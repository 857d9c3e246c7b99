"""The screen alone: span_aligner.c's portable ``screen_of`` against its vector screen, in one process (simd21).

``python benchmarks/results/simd21/screen_bench.py [REPS]`` from this tree's root: builds test copies of the library
(``SA_SCREEN_TESTS``: its ``sa_screen`` runs one screen by number; ``SCREEN_VECTORS`` 2, the production one, and 1) in
a temporary folder, then screens an 8K-token uint32 target (anchor 32) against random filters of 64 KB (a table of
~10K pinned blocks: about 4% of the bits set; and one no window passes) and 2 MB (read ahead), the variants in turns
per call, REPS calls each: best, median and p90 (µs, warm caches, a ctypes call included). Variants: the portable
screen (``screen_of``, what main runs), the vector body compiled without AVX-512 (test-only: its logic, not its
speed), and the AVX-512 one with two vectors and with one, where the CPU has AVX-512. Checks that all give the same
rows.
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from semblend_dynamo import _native
from semblend_dynamo._native import build

NAMES = {
    (2, 0): "portable screen_of",
    (2, 1): "vector body without AVX-512 (test build)",
    (2, 2): "AVX-512, 2 vectors (16 lanes)",
    (1, 2): "AVX-512, 1 vector (8 lanes)",
}


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    screens = {}
    for vectors in (2, 1):
        out = Path(tempfile.mkdtemp()) / "libscreen.so"
        flags = [*build.LIBRARY_FLAGS, "-DSA_SCREEN_TESTS", f"-DSCREEN_VECTORS={vectors}"]
        build.compile_library(build.SOURCE, out, flags)
        function = ctypes.CDLL(str(out)).sa_screen
        function.argtypes = (ctypes.c_void_p, ctypes.c_void_p, *(ctypes.c_int64,) * 4, ctypes.c_void_p)
        function.restype = ctypes.c_int64
        screens[vectors] = function
    rng = np.random.default_rng(0)
    n, anchor = 8192, 32
    t = rng.integers(1, 32000, n).astype(np.uint32)
    passed = np.zeros(2 * n, dtype=np.uint64)
    keys, ids = np.zeros(1 << 17, dtype=np.uint64), np.full(1 << 17, -1, dtype=np.int32)  # a 16K-bucket id table
    for filter_bits, density in ((19, 0.0), (19, 0.04), (24, 0.04)):
        bits = np.packbits(rng.random(1 << filter_bits) < density, bitorder="little")
        view = _native.TableView.of(bits, 64 - filter_bits, keys, ids, 64 - 14, (1 << 14) - 1, 0, 0, 0, 0)
        probe = (view.address, t.ctypes.data, 4, 100, anchor)
        variants = [v for v in NAMES if screens[v[0]](*probe, v[1], passed.ctypes.data) >= 0]  # AVX-512: -3 if absent
        rows = {}
        for v in variants:
            count = screens[v[0]](view.address, t.ctypes.data, 4, n, anchor, v[1], passed.ctypes.data)
            rows[v] = passed[: 2 * count].copy()
        assert all(np.array_equal(rows[v], rows[(2, 0)]) for v in variants), "the screens disagree"
        times: dict[tuple[int, int], list[float]] = {v: [] for v in variants}
        clock = time.perf_counter_ns
        for i in range(reps):
            for v in variants[i % len(variants) :] + variants[: i % len(variants)]:
                t0 = clock()
                screens[v[0]](view.address, t.ctypes.data, 4, n, anchor, v[1], passed.ctypes.data)
                times[v].append((clock() - t0) / 1e3)
        print(
            f"filter {(1 << filter_bits) // 8 // 1024} KB, {len(rows[(2, 0)]) // 2} of {n - anchor + 1} windows pass:"
        )
        for v in variants:
            s = sorted(times[v])
            print(f"  {NAMES[v]}: {s[0]:.2f} / {s[len(s) // 2]:.2f} / {s[int(len(s) * 0.9)]:.2f} us (best / p50 / p90)")


if __name__ == "__main__":
    main()
