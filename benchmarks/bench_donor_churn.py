"""How long donor registration blocks the router's event loop, and what that adds to routing, before and after.

The situation of the Frontend-path benchmark (``benchmarks/frontend_path/run.py``), in one process without the
Frontend: a ``SemanticRouter`` with ``--donors`` resident donors of 512 tokens (index capacity 100K or more, so the
usearch HNSW backend as in production), serving 8,192-token span-path prompts one after another (each reorders 8
donors among random tokens), where every finished prompt becomes a donor (``min_donor_tokens`` 8,192) and its blocks
arrive as kv-events 1 ms after its response; the next request comes 0.5 ms after a response. So the next request is decided while the previous one is registered
and indexed. The baseline is an exact-only router (``SEMBLEND_ENABLED=0``) on the same loop, measured in blocks of
10 requests alternating with the semantic router's, the loop quiet (registrations drained) before each exact block.

Per configuration: request latency (``generate()`` to its first response) of both routers and the difference
("added") at p50/p99/max; and the loop's lag: a probe sleeping 0.5 ms at a time records how late it wakes (the
longest stretch the loop could not run anything); and the CPU time of the loop's thread per request, registration
and kv-event handling included (what moving work off the loop removes, whatever else the machine runs).

``--compare REF`` runs the code of git ``REF`` (e.g. ``main``, exported to a temporary directory) and of this tree, each
in its own process, at the interpreter's default GIL switch interval (5 ms) and at 0.5 ms (``--switch-interval``):
the router's own ``main`` sets 0.5 ms.

Usage: ``.venv/bin/python benchmarks/bench_donor_churn.py [--donors 20000] [--requests 200] [--compare main]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from router_under_test import BLOCK, ROOT, TARGET_TOKENS, WORKER, export_ref, make_router, seed, use_code
from router_under_test import span_target as make_target

PROBE_S = 0.0005
BLOCK_REQUESTS = 10
GAP_S = 0.0005
"""Between one response and the next request (the client's and the Frontend's hops)."""


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def child(args: argparse.Namespace) -> dict[str, Any]:
    use_code(args.code)
    sys.setswitchinterval(args.switch_interval)
    from dynamo.llm import compute_block_hash_for_seq

    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.events.schemas import KvEvent, KvEventBatch, KvStored

    rng = np.random.default_rng(7)
    settings = {"block_size": BLOCK, "embedder": "hash", "min_span_tokens": 64, "min_donor_tokens": TARGET_TOKENS}
    semantic = make_router(SemblendConfig(**settings, index_capacity=max(2 * args.donors, 100_000)), loop_turns=True)
    exact = make_router(SemblendConfig(**settings, enabled=False), loop_turns=True)
    donors, setup_s = await seed(semantic, args.donors, rng)

    def span_target() -> list[int]:
        return make_target(rng, donors)

    targets = [span_target() for _ in range(args.requests)]
    stored_of = [compute_block_hash_for_seq(t, BLOCK) for t in targets]
    event_id = args.donors + 1
    loop = asyncio.get_running_loop()

    def kv_events(i: int) -> None:  # the engine's stored blocks of request i, as Dynamo's kv-events deliver them
        nonlocal event_id
        event_id += 1
        hashes = stored_of[i]
        first = (args.donors + i + 1) << 8
        stored = KvStored([first + j for j in range(len(hashes))], hashes)
        semantic.on_kv_events(KvEventBatch(event_id, 0, int(time.time() * 1000), [KvEvent(WORKER, event_id, stored)]))

    async def first_response_ms(router: Any, tokens: list[int]) -> float:
        t0 = time.perf_counter()
        elapsed = None
        async for _ in router.generate({"token_ids": tokens}):
            elapsed = elapsed if elapsed is not None else (time.perf_counter() - t0) * 1e3
        assert elapsed is not None
        return elapsed

    lag: dict[str, list[float]] = {"semantic": [], "exact": []}
    probing: list[str | None] = [None]

    async def probe() -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            if probing[0] is not None:
                lag[probing[0]].append((time.perf_counter() - t0 - PROBE_S) * 1e3)

    for router in (semantic, exact):  # warm-up (its donor is registered like the others)
        await first_response_ms(router, span_target())
    await semantic.drain_registrations(timeout=60)
    prober = asyncio.ensure_future(probe())
    latency: dict[str, list[float]] = {"semantic": [], "exact": []}
    loop_cpu = {"semantic": 0.0, "exact": 0.0}  # CPU seconds of the loop's thread
    for start in range(0, args.requests, BLOCK_REQUESTS):
        block = range(start, min(start + BLOCK_REQUESTS, args.requests))
        await semantic.drain_registrations(timeout=60)
        probing[0] = "exact"
        cpu = time.thread_time()
        for i in block:
            await asyncio.sleep(GAP_S)
            latency["exact"].append(await first_response_ms(exact, targets[i]))
        loop_cpu["exact"] += time.thread_time() - cpu
        probing[0] = "semantic"
        cpu = time.thread_time()
        for i in block:
            await asyncio.sleep(GAP_S)
            latency["semantic"].append(await first_response_ms(semantic, targets[i]))
            loop.call_later(0.001, kv_events, i)
        await asyncio.sleep(0.002)  # the last request's kv-events
        await semantic.drain_registrations(timeout=60)  # its registrations' loop work is part of the block
        loop_cpu["semantic"] += time.thread_time() - cpu
        probing[0] = None
    prober.cancel()
    placed = semantic.metrics.decisions.labels("semantic_placement")._value.get()
    return {
        "setup_s": setup_s,
        "donors_after": len(semantic.catalog),
        "indexed_after": len(semantic.discovery),
        "placed": placed,
        "latency": latency,
        "lag": lag,
        "loop_cpu_ms_per_request": {k: v * 1e3 / args.requests for k, v in loop_cpu.items()},
    }


def summary(label: str, result: dict[str, Any]) -> list[str]:
    s, e = result["latency"]["semantic"], result["latency"]["exact"]
    ls, le = result["lag"]["semantic"], result["lag"]["exact"]
    cpu = result["loop_cpu_ms_per_request"]
    return [
        f"| {label} | {pct(s, 50):.2f} / {pct(s, 99):.2f} / {max(s):.2f} | {pct(e, 50):.2f} / {pct(e, 99):.2f} / "
        f"{max(e):.2f} | {pct(s, 50) - pct(e, 50):.2f} / {pct(s, 99) - pct(e, 99):.2f} / {max(s) - max(e):.2f} | "
        f"{pct(ls, 50):.2f} / {pct(ls, 99):.2f} / {max(ls):.2f} | {pct(le, 50):.2f} / {pct(le, 99):.2f} / "
        f"{max(le):.2f} | {cpu['semantic']:.2f} / {cpu['exact']:.2f} | {result['placed']:.0f} | "
        f"{result['setup_s']:.0f} |"
    ]


def parent(args: argparse.Namespace) -> None:
    runs: list[tuple[str, str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if Path(args.compare).is_dir():  # a copy of the baseline's tree (where there is no git)
            tmp = str(Path(args.compare).resolve())
        elif args.compare:
            export_ref(args.compare, tmp)
        if args.compare:
            runs += [(f"{args.compare} (before)", tmp, 0.005), (f"{args.compare} (before)", tmp, 0.0005)]
        runs += [("this tree (after)", str(ROOT), 0.005), ("this tree (after)", str(ROOT), 0.0005)]
        results = []
        for label, code, interval in runs:
            cmd = [sys.executable, __file__, "--child", "--code", code, "--switch-interval", str(interval)]
            cmd += ["--donors", str(args.donors), "--requests", str(args.requests)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            results.append((f"{label}, switch interval {interval * 1e3:g} ms", json.loads(out.splitlines()[-1])))
            if args.raw:
                Path(args.raw).mkdir(parents=True, exist_ok=True)
                name = f"{'before' if code == tmp else 'after'}-{interval * 1e3:g}ms.json"
                (Path(args.raw) / name).write_text(out.splitlines()[-1])
    print(
        f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"# {args.donors:,} resident donors of 512 tokens; {args.requests} sequential 8K span-path requests each router"
    )
    print()
    print(
        "| code | semantic ms p50 / p99 / max | exact-only ms p50 / p99 / max | added ms p50 / p99 / max | "
        "loop lag ms (semantic) p50 / p99 / max | loop lag ms (exact) p50 / p99 / max | "
        "loop CPU ms per request (semantic / exact) | placed | setup s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, result in results:
        print("\n".join(summary(label, result)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument(
        "--compare", default="", help="a git ref (or a directory holding a tree) whose code runs as the baseline"
    )
    parser.add_argument("--raw", default="", help="directory for each run's raw JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--switch-interval", type=float, default=sys.getswitchinterval(), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
    else:
        parent(args)


if __name__ == "__main__":
    main()
