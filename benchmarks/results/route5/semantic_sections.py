"""Where one span-path decision's ``semantic`` stage goes: perf_counter sections of ``DonorDiscovery.discover``.

Builds the in-process benchmark's router (``benchmarks/router_under_test.py``: ``--donors`` resident donors of 512
tokens), then for ``--requests`` 8K span-path prompts runs the steps of ``discover`` one by one, each timed, in the
order the code runs them (first, with the caches as the request left them), then ``discover`` itself, and checks that the spans and the plan equal ``discover``'s own. Prints µs p50 / p99 per
section. Usage: ``python benchmarks/results/route5/semantic_sections.py <tree> [--donors 20000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from router_under_test import make_router, seed, span_target, use_code


async def main(args: argparse.Namespace) -> None:
    use_code(args.tree)
    from semblend_dynamo._native import Scan
    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.pipeline import StageTimings as Timings
    from semblend_dynamo.span_aligner import Span, _Candidate

    cfg = SemblendConfig(
        block_size=32,
        embedder="hash",
        min_span_tokens=64,
        min_donor_tokens=8193,
        index_capacity=max(2 * args.donors, 100_000),
    )
    router = make_router(cfg, loop_turns=False)
    rng = np.random.default_rng(7)
    donors, _ = await seed(router, args.donors, rng)
    disc = router.discovery
    al = disc.aligner
    times: dict[str, list[float]] = {}

    def lap(name: str, t: float) -> float:
        now = time.perf_counter()
        times.setdefault(name, []).append((now - t) * 1e6)
        return now

    scratch = np.zeros(args.evict_mb << 20, dtype=np.uint8)
    for i in range(args.requests + 20):
        routed = router.parse({"token_ids": span_target(rng, donors)})
        if scratch.size:  # as between requests through the Frontend: other work has the caches
            scratch += 1
        if i == 20:
            times.clear()
        t00 = t = time.perf_counter()
        digest = routed.namespace.digest()
        t = lap("namespace digest", t)
        target = np.ascontiguousarray(routed.token_array, dtype=np.int64)
        t = lap("ascontiguousarray", t)
        disc.policy.may_seek(routed.tenancy)
        t = lap("policy", t)
        with disc._lock:
            table = al._tables.get(digest)
            scan = Scan(target, al.anchor_tokens, al.block_size, al.min_span_tokens, al.max_diagonals, al._scan_buffer)
            t = lap("align: Scan()", t)
            view = table.native_view()
            t = lap("align: native_view", t)
            positions, hashes = scan.hits(view, None)
            t = lap("align: sa_hits", t)
            diagonals = scan.diagonals(al._shared_hits(table, positions, hashes, None) if positions else [])
            t = lap("align: sa_diagonals", t)
            rows: list[int] = []
            for serial, delta, first, last in diagonals:
                donor = al._by_serial[serial]
                rows += (donor.address, donor.tokens.size, delta, first, last)
            t = lap("align: rows", t)
            runs = scan.runs(rows)
            t = lap("align: sa_runs", t)
            found = [_Candidate(diagonals[r][0], s, e, diagonals[r][1]) for r, s, e in runs]
            t = lap("align: candidates", t)
            chosen = al._choose(found, min(2 * cfg.max_spans, 64))
            t = lap("align: _choose", t)
            spans = [
                Span(al._by_serial[c.serial].donor_id, c.start - c.delta, c.start, c.end - c.start) for c in chosen
            ]
            t = lap("align: Span objects", t)
        decision = disc.planner.plan(int(target.size), spans)
        t = lap("planner.plan", t)
        result = disc._result(routed.request_id, digest, int(target.size), 0, spans, {}, False, decision, Timings())
        t = lap("_result", t)
        times.setdefault("sections (sum)", []).append((t - t00) * 1e6)
        t = time.perf_counter()
        ref = disc.discover(
            routed.request_id, routed.namespace, routed.token_array, embed=False, tenancy=routed.tenancy
        )
        lap("discover (whole, right after the sections)", t)
        assert spans == ref.spans and result.primary_donor == ref.primary_donor, "sections differ from discover"
        assert decision.reason == ref.decision.reason
    if args.profile:
        import cProfile
        import pstats

        routed_all = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(args.requests)]
        profiler = cProfile.Profile()
        profiler.enable()
        for routed in routed_all:
            disc.discover(routed.request_id, routed.namespace, routed.token_array, embed=False, tenancy=routed.tenancy)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    print(
        f"# {args.donors:,} donors, {args.requests} requests, tree {Path(args.tree).resolve().name}, evict {args.evict_mb} MB, "
        f"{len(diagonals)} diagonals, {len(spans)} spans, {len(positions)} shared hits, gc frozen {gc.get_freeze_count()}"
    )
    print("| section | µs p50 | p99 |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {np.percentile(values, 50):.1f} | {np.percentile(values, 99):.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("tree")
    parser.add_argument("--donors", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--evict-mb", type=int, default=0, help="write this many MB between requests")
    parser.add_argument("--profile", action="store_true", help="then cProfile discover() alone")
    asyncio.run(main(parser.parse_args()))
