"""This tree's compiled span search against a base tree's, warm, in one process (simd21).

``python benchmarks/results/simd21/search_ab.py BASE_TREE [PROMPTS] [ROUNDS]`` from this tree's root (its packages on
the path, its modules built; the base tree's ``libspan_aligner.so`` built): bench_connector's scheduler (8K prompts,
~10K pinned blocks, shifted mode), then per case (miss, hit, shifted-hit, as dec19/align_ab.py makes them) the
aligner's ``align`` on PROMPTS prompts, each searched by both trees' ``sa_align`` back to back (which goes first
alternates per prompt), ROUNDS times: the search with its caches warm, nothing else of a decision. Prints each
variant's p50 / p90 / p99 (µs) and checks that both found the same spans. Says which screen this tree's library runs
(``SEMBLEND_ALIGNER_SIMD``).
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo import _native


def main() -> None:
    base = Path(sys.argv[1])
    n_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    assert _native.LIBRARY is not None and _native.SA_ALIGN_ADDRESS, _native.REASON
    other = ctypes.CDLL(str(base / "semblend_dynamo" / "_native" / "libspan_aligner.so"))
    addresses = {"this": _native.SA_ALIGN_ADDRESS, "base": ctypes.cast(other.sa_align, ctypes.c_void_p).value}
    print(f"this tree: {_native.REASON}")
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=1, mode="shifted", audit="none")
    sched, donors = bc.build_scheduler(args, None)
    namespace = sched.model.namespace().digest()
    aligner = sched.aligner
    max_spans = sched.cfg.max_spans
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    clock = time.perf_counter_ns
    for case, start in (("miss", None), ("hit", 0), ("shifted-hit", bc.TPB + bc.TPB // 4)):

        def prompt(start: int | None = start) -> np.ndarray:
            if start is None:
                tokens = [rng.randrange(1, 32000) for _ in range(8192)]
            else:
                tokens = rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]
            return np.asarray(tokens, dtype=np.uint32)

        prompts = [prompt() for _ in range(n_prompts)]
        times: dict[str, list[float]] = {"this": [], "base": []}
        found: dict[str, list[Any]] = {"this": [], "base": []}
        for r in range(rounds):
            for i, t in enumerate(prompts):
                order = ("this", "base") if (i + r) % 2 == 0 else ("base", "this")
                for label in order:
                    _native.SA_ALIGN_ADDRESS = addresses[label]
                    t0 = clock()
                    spans = aligner.align(namespace, t, max_spans=max_spans)
                    t1 = clock()
                    if r > 0:  # the first round warms up
                        times[label].append((t1 - t0) / 1e3)
                    if r == 1:
                        found[label].append(spans)
        _native.SA_ALIGN_ADDRESS = addresses["this"]
        assert found["this"] == found["base"], f"{case}: the trees found different spans"
        tokens = sum(s.length for spans in found["this"] for s in spans)
        parts = []
        for label, v in times.items():
            v = sorted(v)
            parts.append(f"{label} {v[len(v) // 2]:.1f} / {v[int(len(v) * 0.9)]:.1f} / {v[int(len(v) * 0.99)]:.1f}")
        print(
            f"search {case} ({n_prompts} prompts x {rounds - 1} rounds, p50 / p90 / p99 us): "
            + "; ".join(parts)
            + f"; same spans ({tokens} tokens a round)"
        )


if __name__ == "__main__":
    main()
