"""The semantic router's own time per span-path decision, stage by stage, without donor churn.

A ``SemanticRouter`` with ``--donors`` resident donors of 512 tokens (index capacity 100K or more: usearch HNSW, as in
production) serves ``--requests`` sequential 8,192-token span-path prompts (each reorders 8 donors among random
tokens); finished prompts do not become donors (``min_donor_tokens`` above the prompt), so what is timed is the
decision alone, unless ``--serve-donors``: then each finished prompt becomes a donor on the stand-in worker, as in the
Frontend graph (registered by the router's donor thread, its blocks made resident by a kv-event applied after the
stream, as a worker publishes them), so the background work that comes with it (hashing, the catalog, the indexer
thread) overlaps the next decisions. Dynamo's KvRouter is a stand-in (no exact overlap, one idle worker) answering at once, or with
``--runtime-ms`` from another thread that long after each query, as Dynamo's runtime does (``RuntimeStandIn``).

Per run: the router's own stage times of each request (``Decision.latency_us``, what its ``routed`` log line
carries: ``parse``, ``ask_loads``, ``exact``, ``spans`` (the span search while the exact query is in flight, inside
``exact``), ``semantic``, ``load``, ``decide``, ``hint`` (to a link publishing nowhere), ``total_added`` = arrival ->
forwarded; a stage the code does not time reads 0) at p50/p99, ``glue`` (``decide`` less the stages inside it:
``ask_loads``, ``exact``, ``semantic``, ``load``), and the CPU time of the loop's thread per request.
``--profile``: the functions taking the most time in one extra pass (cProfile).

``--compare REF`` runs the code of git ``REF`` (exported to a temporary directory) and of this tree in turns,
``--repeat`` times each (before, after, before, after, ...), each in its own process. ``--compare numpy`` runs this
tree with ``SEMBLEND_NATIVE_ALIGNER=0`` (the span aligner's numpy path) as the baseline instead.

Usage: ``.venv/bin/python benchmarks/bench_route_decision.py [--donors 20000] [--requests 300] [--compare main]``
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from router_under_test import BLOCK, ROOT, TARGET_TOKENS, WORKER, export_ref, make_router, seed, use_code
from router_under_test import span_target as make_target

STAGES = ("parse", "ask_loads", "exact", "spans", "semantic", "load", "decide", "glue", "hint", "total_added")
IN_DECIDE = ("ask_loads", "exact", "semantic", "load")
"""The stages timed inside ``decide`` (``spans`` is inside ``exact``); the rest of ``decide`` is ``glue``."""
SLOW_MS = 5.0
"""Decisions slower than this are counted (the VM's preemptions last 2-7 ms; the tail looked for is 12-18 ms)."""


async def child(args: argparse.Namespace) -> dict[str, Any]:
    use_code(args.code)
    sys.setswitchinterval(0.0005)  # what the router's main sets
    from semblend_dynamo.config import SemblendConfig

    cfg = SemblendConfig(
        block_size=BLOCK,
        embedder="hash",
        min_span_tokens=64,
        min_donor_tokens=TARGET_TOKENS if args.serve_donors else TARGET_TOKENS + 1,
        index_capacity=max(2 * args.donors, 100_000),
        spans_during_exact=args.spans_during_exact == "on",
    )
    router = make_router(cfg, loop_turns=False, runtime_s=args.runtime_ms / 1000)
    rng = np.random.default_rng(7)
    donors, setup_s = await seed(router, args.donors, rng)

    def span_target() -> list[int]:
        return make_target(rng, donors)

    stages: list[dict[str, float]] = []
    record = router._record

    def keep_stages(routed: Any, decision: Any, served: Any) -> None:
        latency = dict(decision.latency_us)
        if "decide" in latency:
            latency["glue"] = latency["decide"] - sum(latency.get(stage, 0.0) for stage in IN_DECIDE)
        stages.append(latency)
        record(routed, decision, served)

    router._record = keep_stages  # type: ignore[method-assign]

    event_ids = iter(range(args.donors + 1, 1 << 62))  # kv-event ids on the stand-in worker, after the seeded donors'

    async def run(targets: list[list[int]]) -> float:
        cpu = time.thread_time()
        for tokens in targets:
            async for _ in router.generate({"token_ids": tokens}):
                pass
            if args.serve_donors:
                store_blocks(router, tokens, next(event_ids))
        return time.thread_time() - cpu

    await run([span_target() for _ in range(10)])  # warm-up
    stages.clear()
    cpu = await run([span_target() for _ in range(args.requests)])
    timed = list(stages)
    placed = router.metrics.decisions.labels("semantic_placement")._value.get()
    profile = ""
    if args.profile:
        targets = [span_target() for _ in range(args.requests)]
        profiler = cProfile.Profile()
        profiler.enable()
        await run(targets)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        profile = out.getvalue()
    return {
        "setup_s": setup_s,
        "placed": placed,
        "requests": args.requests,
        "stages_us": {stage: [s.get(stage, 0.0) for s in timed] for stage in STAGES},
        "loop_cpu_ms_per_request": cpu * 1e3 / args.requests,
        "native_aligner": getattr(router.discovery.aligner, "native", False),
        "gate_unsure": getattr(router.catalog, "gate_unsure", None),
        "profile": profile,
    }


def store_blocks(router: Any, tokens: list[int], event_id: int) -> None:
    """The worker's kv-event for a served prompt's blocks (engine block ids far from the seeded donors')."""
    from dynamo.llm import compute_block_hash_for_seq

    from semblend_dynamo.events.schemas import KvEvent, KvStored

    hashes = compute_block_hash_for_seq(tokens, BLOCK)
    first = (1 << 40) + (event_id << 9)
    router.catalog.apply_kv_events(
        [KvEvent(WORKER, event_id, KvStored(list(range(first, first + len(hashes))), hashes))]
    )


def row(label: str, result: dict[str, Any]) -> str:
    cells = []
    for stage in STAGES:
        values = np.asarray(result["stages_us"][stage]) / 1e3
        cells.append(f"{np.percentile(values, 50):.3f} / {np.percentile(values, 99):.3f}")
    decide = np.asarray(result["stages_us"]["decide"]) / 1e3
    glue = np.asarray(result["stages_us"]["glue"]) / 1e3
    return (
        f"| {label} | {' | '.join(cells)} | {decide.max():.2f}, {glue.max():.2f} | {int((decide > SLOW_MS).sum())} | "
        f"{result['loop_cpu_ms_per_request']:.3f} | "
        f"{result['placed']:.0f}/{result['requests'] + 10} | {result['setup_s']:.0f} |"
    )


def parent(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        baseline = (f"{args.compare} (before)", tmp, "before", {})
        if args.compare == "numpy":
            baseline = ("this tree, numpy aligner (before)", str(ROOT), "before", {"SEMBLEND_NATIVE_ALIGNER": "0"})
        elif args.compare:
            export_ref(args.compare, tmp)
        codes = [baseline, ("this tree (after)", str(ROOT), "after", {})]
        if not args.compare:
            codes = codes[1:]
        rows = []
        for turn in range(1, args.repeat + 1):
            for label, code, name, env in codes:
                cmd = [sys.executable, __file__, "--child", "--code", code]
                cmd += ["--donors", str(args.donors), "--requests", str(args.requests)]
                cmd += ["--runtime-ms", str(args.runtime_ms)]
                cmd += ["--profile"] if args.profile else []
                cmd += ["--serve-donors"] if args.serve_donors else []
                cmd += ["--spans-during-exact", args.spans_during_exact]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, **env}).stdout
                result = json.loads(out.splitlines()[-1])
                rows.append(row(f"{label}, run {turn}", result))
                if args.raw:
                    Path(args.raw).mkdir(parents=True, exist_ok=True)
                    (Path(args.raw) / f"{name}-{turn}.json").write_text(out.splitlines()[-1])
                if result["profile"]:
                    print(f"## {label}, run {turn}: cProfile, {args.requests} decisions\n```\n{result['profile']}```")
    print(
        f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(f"# {args.donors:,} resident donors of 512 tokens; {args.requests} sequential 8K span-path requests per run")
    print(f"# spans during the exact query: {args.spans_during_exact}")
    if args.serve_donors:
        print("# each finished prompt becomes a donor, its blocks resident (--serve-donors)")
    print(
        f"# Dynamo's queries answered {f'by a runtime stand-in after {args.runtime_ms} ms' if args.runtime_ms else 'at once'}"
    )
    print()
    print(
        "| code | "
        + " | ".join(f"{stage} ms p50 / p99" for stage in STAGES)
        + f" | decide, glue max ms | decide > {SLOW_MS:.0f} ms | loop CPU ms per request | placed | setup s |"
    )
    print("|---|" + "---|" * (len(STAGES) + 5))
    print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each code, in turns")
    parser.add_argument(
        "--compare", default="", help="a git ref whose code runs as the baseline, or numpy: this tree's numpy aligner"
    )
    parser.add_argument("--profile", action="store_true", help="add a cProfile pass to each run")
    parser.add_argument(
        "--runtime-ms",
        type=float,
        default=0.0,
        help="answer Dynamo's queries from another thread this long after they are asked, as Dynamo's runtime does "
        "(0: at once, on the loop)",
    )
    parser.add_argument(
        "--serve-donors",
        action="store_true",
        help="each finished prompt becomes a donor, its blocks resident (as in the Frontend graph)",
    )
    parser.add_argument(
        "--spans-during-exact",
        choices=("on", "off"),
        default="on",
        help="SEMBLEND_SPANS_DURING_EXACT (off: spans searched after the exact answer)",
    )
    parser.add_argument("--raw", default="", help="directory for each run's raw JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", default=str(ROOT), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
    else:
        parent(args)


if __name__ == "__main__":
    main()
