"""A/B of ``SpanAligner.align`` between two trees in one process, calls interleaved one by one.

``python benchmarks/results/span7/align_ab.py BASE_TREE [THIS_TREE] [--donors 20000,100000] [--calls 600]
[--evict-mb 0] [--widths int64,uint32]``: imports ``semblend_dynamo`` from each tree in turn (its own compiled core, which must be built and
loaded: checked), gives both aligners the same random donors of 512 tokens (the router benchmark's: vocabulary
100..7000, read-only arrays of the aligner's width, so both share them), then aligns the same 8K targets with each,
alternating which tree goes first, and checks both return the same spans. Cases: ``shifted hit`` (8 donors at shifted
offsets among fresh tokens: the router benchmark's span target), ``shared hit`` (the same after a 256-token system
prompt that every 20th donor starts with: chunks more donors share than ``max_postings``), ``miss`` (tokens of the
donors' vocabulary). Widths: int64 (the router's) and uint32 (the connector's). ``--evict-mb``: bytes written between
calls, as the work between two requests evicts the caches. Prints µs p50 / p99 of wall time per tree and case.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

DONOR_TOKENS = 512
TARGET = 8192
SYSTEM = 256


def load_tree(tree: str) -> ModuleType:
    """``semblend_dynamo.span_aligner`` of ``tree``, its compiled core loaded (the modules stay referenced)."""
    for name in [m for m in sys.modules if m == "semblend_dynamo" or m.startswith("semblend_dynamo.")]:
        del sys.modules[name]
    sys.path.insert(0, str(Path(tree).resolve()))
    try:
        import semblend_dynamo.span_aligner as module
        from semblend_dynamo import _native
    finally:
        sys.path.pop(0)
    assert Path(module.__file__).resolve().is_relative_to(Path(tree).resolve()), module.__file__
    assert _native.LIBRARY is not None, f"{tree}: {_native.REASON}"
    print(f"# {tree}: {_native.REASON}")
    return module


def targets(rng: np.random.Generator, donors: np.ndarray, case: str) -> np.ndarray:
    if case == "miss":
        return rng.integers(100, 7000, size=TARGET)
    picks = rng.choice(np.arange(1, len(donors)), size=8, replace=False)
    filler = rng.integers(7000, 9000, size=TARGET - 8 * DONOR_TOKENS)
    out = np.concatenate([filler[:2040], *[donors[i] for i in picks[::-1]], filler[2040:]])
    if case == "shared hit":
        out[:SYSTEM] = donors[0, :SYSTEM]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("this", nargs="?", default=str(Path(__file__).resolve().parents[3]))
    parser.add_argument("--donors", default="20000,100000")
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--evict-mb", type=int, default=0)
    parser.add_argument("--widths", default="int64,uint32")
    args = parser.parse_args()
    trees = {"base": load_tree(args.base), "this": load_tree(args.this)}
    scratch = np.zeros(args.evict_mb << 20, dtype=np.uint8)
    for n in (int(x) for x in args.donors.split(",")):
        rng = np.random.default_rng(7)
        donors = rng.integers(100, 7000, size=(n, DONOR_TOKENS), dtype=np.int64)
        donors[::20, :SYSTEM] = donors[0, :SYSTEM]
        for u32 in [w == "uint32" for w in args.widths.split(",")]:
            width = np.uint32 if u32 else np.int64
            arrays = []
            for row in donors:
                arr = row.astype(width)
                arr.flags.writeable = False
                arrays.append(arr)
            aligners: dict[str, Any] = {}
            for name, module in trees.items():
                t0 = time.perf_counter()
                aligner = module.SpanAligner(32, 64, tokens_u32=u32)
                for i, arr in enumerate(arrays):
                    aligner.add_donor(f"d{i}", "ns", arr)
                aligners[name] = aligner
                print(f"# {n:,} donors {width.__name__}: {name} built in {time.perf_counter() - t0:.1f} s")
            gc.collect()
            gc.freeze()
            print(f"\n## {n:,} donors, {width.__name__}, {args.calls} calls a tree and case, evict {args.evict_mb} MB")
            print(
                "| case | spans | base p50 | this p50 | base p99 | this p99 | this faster in |\n|---|---|---|---|---|---|---|"
            )
            for case in ("shifted hit", "shared hit", "miss"):
                times: dict[str, list[float]] = {name: [] for name in aligners}
                wins = 0
                for i in range(args.calls + 20):
                    target = targets(rng, donors, case).astype(width)
                    order = list(aligners) if i % 2 else list(aligners)[::-1]
                    spans = {}
                    took = {}
                    for name in order:
                        if scratch.size:
                            scratch += 1
                        t = time.perf_counter()
                        found = aligners[name].align("ns", target, max_spans=16)
                        took[name] = (time.perf_counter() - t) * 1e6
                        spans[name] = [(s.donor_id, s.donor_start, s.target_start, s.length) for s in found]
                    assert spans["base"] == spans["this"], (case, spans)
                    if i >= 20:
                        for name in aligners:
                            times[name].append(took[name])
                        wins += took["this"] < took["base"]
                b, h = np.array(times["base"]), np.array(times["this"])
                print(
                    f"| {case} | {len(spans['this'])} | {np.percentile(b, 50):.1f} | {np.percentile(h, 50):.1f} | "
                    f"{np.percentile(b, 99):.1f} | {np.percentile(h, 99):.1f} | {100 * wins / len(h):.0f}% |"
                )
            gc.unfreeze()
            del aligners, arrays
            gc.collect()


if __name__ == "__main__":
    main()
