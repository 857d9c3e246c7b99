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
import gc
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

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 32
DONOR_TOKENS = 512
TARGET_TOKENS = 8192
WORKER = 0x1234
PROBE_S = 0.0005
BLOCK_REQUESTS = 10
SEED_CHUNK = 1024
GAP_S = 0.0005
"""Between one response and the next request (the client's and the Frontend's hops)."""


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def child(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(args.code).resolve()))
    sys.setswitchinterval(args.switch_interval)
    from dynamo.llm import compute_block_hash_for_seq

    import semblend_dynamo
    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.events.link import NatsLink
    from semblend_dynamo.events.publisher import EvidencePublisher
    from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvEventBatch, KvStored
    from semblend_dynamo.namespace import NamespaceKey
    from semblend_dynamo.router.__main__ import build_discovery
    from semblend_dynamo.router.catalog import DonorCatalog
    from semblend_dynamo.router.handler import SemanticRouter
    from semblend_dynamo.router.metrics import RouterMetrics

    assert Path(semblend_dynamo.__file__).resolve().is_relative_to(Path(args.code).resolve())

    class KvRouterStandIn:
        """Dynamo's KvRouter as the router sees it, answering after one loop turn: no exact overlap, one idle worker."""

        async def get_overlap_scores(self, token_ids: list[int], **_: Any) -> dict[str, Any]:
            await asyncio.sleep(0)  # one loop turn, as an awaited call into Dynamo's runtime takes
            return {"workers": [{"worker_id": WORKER, "dp_rank": 0, "device_blocks": 0}]}

        async def get_potential_loads(self, token_ids: list[int]) -> list[dict[str, int]]:
            return [{"worker_id": WORKER, "dp_rank": 0, "active_requests": 0}]

        async def generate_from_request(self, request: dict[str, Any]) -> Any:
            async def stream() -> Any:
                await asyncio.sleep(0)
                yield {"token_ids": [1], "routing_data": {"worker_id": {"decode_worker_id": WORKER}}}

            return stream()

        async def dump_events(self) -> str:
            return "[]"

    class LinkStandIn(NatsLink):
        """Connected, publishing nowhere."""

        @property
        def connected(self) -> bool:
            return True

        async def publish(self, subject: str, data: bytes, *, reply: str = "") -> None:
            return None

    def make_router(cfg: SemblendConfig) -> SemanticRouter:
        link = LinkStandIn(cfg, name="bench")
        discovery = build_discovery(cfg)
        publisher = EvidencePublisher(link, queue_size=1 << 16)
        publisher.start()
        return SemanticRouter(
            cfg,
            kv_router=KvRouterStandIn(),
            discovery=discovery,
            catalog=DonorCatalog(cfg.index_capacity, discovery),
            link=link,
            publisher=publisher,
            metrics=RouterMetrics(),
            namespace_of=lambda lora, salt: NamespaceKey(
                model_id=cfg.model_id, tokens_per_block=BLOCK, cache_salt=salt
            ),
            deployment="bench",
        )

    rng = np.random.default_rng(7)
    settings = {"block_size": BLOCK, "embedder": "hash", "min_span_tokens": 64, "min_donor_tokens": TARGET_TOKENS}
    semantic = make_router(SemblendConfig(**settings, index_capacity=max(2 * args.donors, 100_000)))
    exact = make_router(SemblendConfig(**settings, enabled=False))
    assert semantic.discovery is not None and semantic.discovery.embedder is not None
    dim = semantic.discovery.embedder.dim
    donors = rng.integers(100, 7000, size=(args.donors, DONOR_TOKENS), dtype=np.int64)

    t0 = time.perf_counter()
    namespace = semantic.parse({"token_ids": [1]}).namespace
    vectors = rng.standard_normal((args.donors, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for i, tokens in enumerate(donors.tolist()):
        hashes = compute_block_hash_for_seq(tokens, BLOCK)
        embedding, edim = DonorRegistration.pack_embedding(vectors[i])
        registration = DonorRegistration(
            donor_id=f"d{i}",
            worker_id=WORKER,
            deployment="bench",
            namespace=namespace.digest(),
            num_tokens=DONOR_TOKENS,
            block_size=BLOCK,
            block_hashes=hashes,
            embedding=embedding,
            embedding_dim=edim,
        )
        semantic.catalog.add(registration, local=(namespace, tokens))
        stored = KvStored([(i << 8) + j for j in range(len(hashes))], hashes)
        semantic.catalog.apply_kv_events([KvEvent(WORKER, i + 1, stored)])
        if i % SEED_CHUNK == SEED_CHUNK - 1:  # the indexer queues a bounded number of prompts: let it catch up
            await semantic.drain_registrations(timeout=3600)
    await semantic.drain_registrations(timeout=3600)
    setup_s = time.perf_counter() - t0
    assert len(semantic.catalog) == args.donors == len(semantic.discovery)
    gc.collect()
    gc.freeze()

    def span_target() -> list[int]:
        picks = rng.choice(args.donors, size=8, replace=False)
        filler = rng.integers(7000, 9000, size=TARGET_TOKENS - 8 * DONOR_TOKENS).tolist()
        return filler[:2048] + [t for i in picks[::-1] for t in donors[i].tolist()] + filler[2048:]

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

    async def first_response_ms(router: SemanticRouter, tokens: list[int]) -> float:
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
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.compare], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
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
