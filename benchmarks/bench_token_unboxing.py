"""Unboxing a prompt's Python list of token ids: the ways a connector can get a buffer out of it, timed side by side.

Run: ``.venv/bin/python benchmarks/bench_token_unboxing.py [--tokens 8192] [--rounds 9]``

TensorRT-LLM hands the scheduler connector each prompt as a Python list of ints, so every decision starts by reading
8K Python ints. Each way is timed in interleaved rounds (the best of 3 x 300 calls per round); the table gives the
minimum and median over rounds, and each way's median over ``array("I", list)`` (the connector's way before issue
16.2), measured in the same run. The list is a slice of a donor's list plus fresh ids, like the benchmark's hits.
"""

from __future__ import annotations

import argparse
import array
import os
import platform
import random
import statistics
import struct
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

from semblend_dynamo.events.schemas import u32_tokens


def ways() -> dict[str, Callable[[list[int]], Any]]:
    return {
        'array("I", list) (baseline)': lambda tokens: array.array("I", tokens),
        'u32_tokens: array("I").fromlist(list)': u32_tokens,
        "u32_tokens + int64 view (the connector)": lambda tokens: np.frombuffer(
            u32_tokens(tokens), dtype=np.uint32
        ).astype(np.int64),
        'array("q", list)': lambda tokens: array.array("q", tokens),
        'struct.pack("<nI", *list)': lambda tokens: struct.pack(f"<{len(tokens)}I", *tokens),
        "np.array(list, dtype=np.int64)": lambda tokens: np.array(tokens, dtype=np.int64),
        "np.array(list, dtype=np.uint32)": lambda tokens: np.array(tokens, dtype=np.uint32),
        "np.fromiter(list, np.int64, count=n)": lambda tokens: np.fromiter(tokens, dtype=np.int64, count=len(tokens)),
        "np.fromiter(list, np.uint32, count=n)": lambda tokens: np.fromiter(tokens, dtype=np.uint32, count=len(tokens)),
        "list(list) (a copy: no unboxing)": list,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    rng = random.Random(0)
    donor = [rng.randrange(1, 32000) for _ in range(args.tokens)]
    cut = args.tokens * 3 // 4
    tokens = donor[:cut] + [rng.randrange(1, 32000) for _ in range(args.tokens - cut)]
    candidates = ways()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(args.rounds):
        for name, way in candidates.items():  # interleaved, so load changes hit every way alike
            best = min(timeit.repeat(lambda way=way: way(tokens), number=300, repeat=3))  # type: ignore[misc]
            samples[name].append(best / 300 * 1e6)
    base = statistics.median(samples['array("I", list) (baseline)'])
    print(f"{args.tokens} token ids, {args.rounds} rounds; load average (1 min) at the end {os.getloadavg()[0]:.2f}")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print("| way | min (µs) | median (µs) | median / baseline |")
    print("|---|---|---|---|")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"| {name} | {min(values):.1f} | {median:.1f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
