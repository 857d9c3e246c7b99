"""The cost of the router's exact-win gate (``SemanticRouter._exact_may_win``) with N resident donors.

Builds the in-process benchmark's router (``benchmarks/router_under_test.py``, one worker holding every donor's
blocks) and times the gate, µs p50 / p99 over 2,000 calls each, for 8K span-path prompts (nothing stored: the span
search runs during the exact query) and for the donors' own 512-token prompts (first and threshold blocks stored:
the router waits for the exact answer, as before).

Usage: ``python benchmarks/results/route6/gate_cost.py --donors 20000`` (from the repository root)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from router_under_test import BLOCK, TARGET_TOKENS, make_router, seed, span_target


async def main(donors: int) -> None:
    from semblend_dynamo.config import SemblendConfig

    cfg = SemblendConfig(
        block_size=BLOCK,
        embedder="hash",
        min_span_tokens=64,
        min_donor_tokens=TARGET_TOKENS + 1,
        index_capacity=max(2 * donors, 100_000),
    )
    router = make_router(cfg, loop_turns=False)
    rng = np.random.default_rng(7)
    tokens, _ = await seed(router, donors, rng)
    cases = {
        "span-path prompt (search runs ahead)": [span_target(rng, tokens) for _ in range(2000)],
        "a donor's own prompt (waits for exact)": [tokens[i].tolist() for i in rng.choice(donors, 2000)],
    }
    for name, prompts in cases.items():
        routed = [router.parse({"token_ids": p}) for p in prompts]
        times, answers = [], set()
        for r in routed:
            t0 = time.perf_counter()
            answers.add(router._exact_may_win(r))
            times.append((time.perf_counter() - t0) * 1e6)
        print(
            f"{name}: may win {sorted(answers)}, µs p50 {np.percentile(times, 50):.1f} p99 {np.percentile(times, 99):.1f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--donors", type=int, default=20_000)
    asyncio.run(main(parser.parse_args().donors))
