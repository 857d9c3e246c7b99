"""Where the span stage (``spans``) of a span-path decision goes: each step of it timed on the loop's thread.

Builds ``bench_route_decision.py``'s router (``--donors`` resident donors, the runtime stand-in answering Dynamo's
queries ``--runtime-ms`` after asking, ``--serve-donors``: each finished prompt registered by the donor thread) on the
code of ``--code`` and wraps the span stage's callees with wall and thread-CPU timers (loop thread only). Prints
per-step p50 / p90 / p99 in µs. A diagnostic, not a benchmark: the wrappers add ~1 µs a step, and the gate is run as
its steps (``gate step: ...``, one extra block-map read) before the catalog's own ``stored_together``; ``bg:`` rows
are the background threads' work (``bg: block hashes`` without a thread name: the gate's hash on the loop).

Usage: ``python benchmarks/results/route8/span_sections.py --code TREE [--donors 20000] [--serve-donors]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ for router_under_test


def wrap(owner: Any, name: str, label: str, sink: dict[str, list[float]], loop_thread: list[int]) -> None:
    fn = getattr(owner, name)
    static = isinstance(owner, type) and isinstance(owner.__dict__.get(name), staticmethod)

    @functools.wraps(fn)
    def timed(*a: Any, **k: Any) -> Any:
        if threading.get_ident() != loop_thread[0]:
            if not label.startswith("bg:"):
                return fn(*a, **k)
            where = threading.current_thread().name.split("_")[0]
        else:
            where = "loop"
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            tag = label if where == "loop" else f"{label} [{where}]"
            sink.setdefault(tag, []).append((time.perf_counter() - t0) * 1e6)
            sink.setdefault(tag + " (cpu)", []).append((time.thread_time() - c0) * 1e6)

    setattr(owner, name, staticmethod(timed) if static else timed)


async def main_async(args: argparse.Namespace) -> None:
    from router_under_test import BLOCK, TARGET_TOKENS, make_router, seed, span_target, use_code

    use_code(args.code)
    sys.setswitchinterval(0.0005)
    import semblend_dynamo.router.handler as handler
    import semblend_dynamo.span_aligner as span_aligner
    from semblend_dynamo import pipeline
    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.router.catalog import DonorCatalog

    cfg = SemblendConfig(
        block_size=BLOCK,
        embedder="hash",
        min_span_tokens=64,
        min_donor_tokens=TARGET_TOKENS if args.serve_donors else TARGET_TOKENS + 1,
        index_capacity=max(2 * args.donors, 100_000),
    )
    router = make_router(cfg, loop_turns=False, runtime_s=args.runtime_ms / 1000)
    rng = np.random.default_rng(7)
    donors, setup_s = await seed(router, args.donors, rng)
    sink: dict[str, list[float]] = {}
    loop_thread = [threading.get_ident()]
    wrap(handler.SemanticRouter, "_spans_during_exact", "spans (whole)", sink, loop_thread)
    original_gate = handler.SemanticRouter._exact_may_win

    def gate_steps(self: Any, routed: Any) -> bool:
        """The gate's steps, each timed (the same steps as the code's own gate, when it has them)."""
        if not hasattr(handler, "_blocks_to_win") or not hasattr(handler, "compute_block_hash_for_seq"):
            return original_gate(self, routed)
        t0 = time.perf_counter()
        tokens, size = routed.tokens, self.cfg.block_size
        needed = handler._blocks_to_win(len(tokens), size, self.cfg.exact_route_threshold)
        first_and_last = tokens[:size] + tokens[(needed - 1) * size : needed * size]
        t1 = time.perf_counter()
        hashes = handler.compute_block_hash_for_seq(
            first_and_last, size, lora_name=routed.lora or None, cache_namespace=routed.cache_salt or None
        )
        t2 = time.perf_counter()
        residency = self.catalog._residency
        workers = list(residency._workers.values())
        t3 = time.perf_counter()
        found = [blocks.hashes.get(h) for blocks in workers for h in hashes[:1]]
        t4 = time.perf_counter()
        out = self.catalog.stored_together(hashes)
        t5 = time.perf_counter()
        for label, a, b in (
            ("slice", t0, t1),
            ("hash", t1, t2),
            ("workers", t2, t3),
            ("U64Map.get x1", t3, t4),
            ("stored_together", t4, t5),
        ):
            sink.setdefault("gate step: " + label, []).append((b - a) * 1e6)
        del found
        return out

    handler.SemanticRouter._exact_may_win = gate_steps
    wrap(handler.SemanticRouter, "_exact_may_win", "gate: _exact_may_win", sink, loop_thread)
    wrap(DonorCatalog, "stored_together", "gate: catalog.stored_together", sink, loop_thread)
    wrap(pipeline.DonorDiscovery, "find_spans", "find_spans", sink, loop_thread)
    wrap(span_aligner.SpanAligner, "align", "SpanAligner.align", sink, loop_thread)
    if hasattr(span_aligner.SpanAligner, "_spans_of"):
        wrap(span_aligner.SpanAligner, "_spans_of", "align: _spans_of", sink, loop_thread)
    wrap(span_aligner._native, "align", "align: _native.align", sink, loop_thread)
    wrap(handler.SemanticRouter, "_add_donor", "bg: _add_donor", sink, loop_thread)
    wrap(DonorCatalog, "add", "bg: catalog.add", sink, loop_thread)
    wrap(DonorCatalog, "apply_kv_events", "bg: apply_kv_events", sink, loop_thread)
    if hasattr(handler, "compute_block_hash_for_seq"):
        wrap(handler, "compute_block_hash_for_seq", "bg: block hashes", sink, loop_thread)
    from semblend_dynamo.router import indexer as indexer_mod

    for name in ("_apply",):
        if hasattr(indexer_mod.PipelineIndexer, name):
            wrap(indexer_mod.PipelineIndexer, name, f"bg: indexer.{name}", sink, loop_thread)
    event_ids = iter(range(args.donors + 1, 1 << 62))
    from bench_route_decision import store_blocks

    async def run(n: int) -> None:
        for _ in range(n):
            tokens = span_target(rng, donors)
            async for _ in router.generate({"token_ids": tokens}):
                pass
            if args.serve_donors:
                store_blocks(router, tokens, next(event_ids))
            if args.gap_ms:
                await asyncio.sleep(args.gap_ms / 1000)

    await run(10)
    sink.clear()
    await run(args.requests)
    print(f"# code {args.code}; {args.donors} donors (seeded in {setup_s:.0f} s); serve_donors={args.serve_donors}")
    print("| step | p50 µs | p90 µs | p99 µs | n |")
    print("|---|---|---|---|---|")
    for label, values in sink.items():
        v = np.asarray(values)
        print(
            f"| {label} | {np.percentile(v, 50):.1f} | {np.percentile(v, 90):.1f} | {np.percentile(v, 99):.1f} | {v.size} |"
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--code", default=str(Path(__file__).resolve().parents[3]))
    p.add_argument("--donors", type=int, default=20_000)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--runtime-ms", type=float, default=0.4)
    p.add_argument("--serve-donors", action="store_true")
    p.add_argument("--gap-ms", type=float, default=0.0)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
