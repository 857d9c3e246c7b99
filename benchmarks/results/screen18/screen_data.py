"""bench_connector's filter (8K prompts, ~10K pinned blocks) and an 8K-token miss and hit target, as raw files for
screen_variants.c (screen18): ``python benchmarks/results/screen18/screen_data.py DIR`` from a tree's root."""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, "benchmarks")
import bench_connector as bc


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=100, mode="shifted", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    table = next(iter(sched.aligner._tables.values()))
    assert int(table._shift) == 45, "screen_variants.c assumes a 64 KiB filter"
    table._bits.tofile(out / "bits.bin")
    rng = random.Random(1)
    miss = [rng.randrange(1, 32000) for _ in range(8192)]
    hit = rng.choice(donors)[:6144] + [rng.randrange(1, 32000) for _ in range(2048)]
    np.array(miss, dtype=np.uint32).tofile(out / "miss.bin")
    np.array(hit, dtype=np.uint32).tofile(out / "hit.bin")


if __name__ == "__main__":
    main()
