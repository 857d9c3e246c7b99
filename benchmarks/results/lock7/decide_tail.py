"""Where a slow `decide` spends its time: the route-decision benchmark's router, with served prompts registered as
donors and their blocks made resident (as the Frontend run's graph does), every untimed section of the decision
timed, the catalog lock's waits and holds, the background threads' steps and the collector's runs recorded with
timestamps, and each slow request printed with what overlapped it.

Usage: python benchmarks/results/lock7/decide_tail.py [--donors 100000] [--requests 300] [--gap-ms 5] [--code TREE]

Session 10 (lock7) copy of ``benchmarks/results/tail6/decide_tail.py``: it also runs on trees whose catalog lock is a
wrapper (the wrapper's inner RLock is timed, so the kv-event batches it queues are applied under the timed lock), and
times the exact-wins gate (``stored_together``) and the queued batches' application, and prints the gate's "unsure"
answers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from router_under_test import BLOCK, TARGET_TOKENS, WORKER, make_router, seed, span_target, use_code

EVENTS: list[tuple[str, str, float, float, float]] = []  # (what, thread, start, end, thread CPU s), perf_counter s


def note(what: str, start: float, cpu: float = float("nan")) -> None:
    EVENTS.append((what, threading.current_thread().name, start, time.perf_counter(), time.thread_time() - cpu))


def timed(obj: object, name: str, label: str) -> None:
    fn = getattr(obj, name)

    def wrapper(*a, **k):  # type: ignore[no-untyped-def]
        t0, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            note(label, t0, cpu)

    setattr(obj, name, wrapper)


class TimedRLock:
    """The catalog's RLock, with each outermost acquisition's wait and hold noted."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = threading.local()

    def acquire(self, blocking: bool = True) -> bool:
        depth = getattr(self._depth, "n", 0)
        t0 = time.perf_counter()
        if not self._lock.acquire(blocking):
            return False
        if depth == 0:
            self._depth.held = time.perf_counter()
            self._depth.cpu = time.thread_time()
            note("catalog lock wait", t0)
        self._depth.n = depth + 1
        return True

    def release(self) -> None:
        self._depth.n -= 1
        if self._depth.n == 0:
            note("catalog lock hold", self._depth.held, self._depth.cpu)
        self._lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


async def main(args: argparse.Namespace) -> None:
    use_code(args.code)
    sys.setswitchinterval(0.0005)
    from dynamo.llm import compute_block_hash_for_seq

    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.events.schemas import KvEvent, KvStored

    cfg = SemblendConfig(
        block_size=BLOCK,
        embedder="hash",
        min_span_tokens=64,
        min_donor_tokens=TARGET_TOKENS,
        index_capacity=max(2 * args.donors, 100_000),
        spans_during_exact=bool(args.spans_during_exact),
    )
    router = make_router(cfg, loop_turns=False, runtime_s=args.runtime_ms / 1000)
    rng = np.random.default_rng(7)
    donors, setup_s = await seed(router, args.donors, rng)
    print(f"# seeded {args.donors} in {setup_s:.0f} s", flush=True)
    if hasattr(router.catalog._lock, "inner"):  # a wrapper around the RLock (lock7 on)
        router.catalog._lock.inner = TimedRLock()
        timed(router.catalog._lock, "_apply_queued", "catalog _apply_queued (kv-events queued)")
    else:
        router.catalog._lock = TimedRLock()
    timed(router.catalog, "stored_together", "stored_together (gate)")
    timed(router, "_add_donor", "_add_donor")
    timed(router.catalog, "apply_kv_events", "apply_kv_events")
    timed(router.catalog.indexer, "_apply", "indexer _apply")
    timed(router.discovery, "register_donor", "register_donor")
    timed(router.discovery.aligner, "prepare_donor", "aligner.prepare_donor")
    timed(router.discovery.aligner, "commit_donor", "aligner.commit_donor")
    if router.discovery.index is not None:
        timed(router.discovery.index, "insert_batch", "index.insert_batch")
    timed(router.catalog, "resident_donor", "resident_donor")
    from semblend_dynamo import span_aligner
    from semblend_dynamo.router import u64map

    timed(span_aligner._IdTable, "_resize", "_IdTable._resize")
    timed(span_aligner._ChunkTable, "_rebuild", "_ChunkTable._rebuild (filter)")
    timed(span_aligner._ChunkTable, "_take_ids", "_ChunkTable._take_ids")
    timed(u64map.U64Map, "_merge_overlay", "U64Map._merge_overlay")
    timed(u64map.U64Map, "_rewrite_step", "U64Map._rewrite_step")
    timed(u64map.U64Map, "_build_dir", "U64Map._build_dir")
    timed(router.discovery, "find_spans", "find_spans")
    from semblend_dynamo.router import indexer

    timed(indexer, "trim_heap", "trim_heap (malloc_trim)")
    if args.trim_after:
        indexer.TRIM_AFTER = args.trim_after
    timed(router.discovery, "discover", "discover")
    timed(router, "_hint", "_hint")
    timed(router, "_plan_chain", "_plan_chain")
    timed(router.policy, "may_seek", "may_seek")
    timed(router.embeddings, "_embed_batch", "embed_batch")
    gc_start: dict[int, float] = {}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_start[info["generation"]] = time.perf_counter()
        else:
            note(f"gc gen{info['generation']} ({info['collected']} collected)", gc_start[info["generation"]])

    gc.callbacks.append(on_gc)
    decisions: list[tuple[float, float, dict[str, float]]] = []
    record = router._record
    event_id = args.donors + 1

    def keep(routed, decision, served):  # type: ignore[no-untyped-def]
        decisions.append((t_request, time.perf_counter(), dict(decision.latency_us)))
        record(routed, decision, served)

    router._record = keep
    for _ in range(args.requests + 10):
        tokens = span_target(rng, donors)
        t_request = time.perf_counter()
        async for _ in router.generate({"token_ids": tokens}):
            pass
        if args.serve_kv:  # the worker's kv-event for the prompt's blocks, as a mocker publishes it
            hashes = compute_block_hash_for_seq(tokens, BLOCK)
            stored = KvStored([(1 << 40) + (event_id << 9) + j for j in range(len(hashes))], hashes)
            router.catalog.apply_kv_events([KvEvent(WORKER, event_id, stored)])
            event_id += 1
        await asyncio.sleep(args.gap_ms / 1000)
    await router.drain_registrations(timeout=60)
    decisions = decisions[10:]
    stages = ("ask_loads", "exact", "semantic", "load")
    glue = np.array([d["decide"] - sum(d.get(s, 0) for s in stages) for _, _, d in decisions]) / 1e3
    decide = np.array([d["decide"] for _, _, d in decisions]) / 1e3
    print(f"# indexer counters {dict(router.catalog.indexer.counters)}")
    print(
        f"# gate unsure {getattr(router.catalog, 'gate_unsure', '-')}, queued kv-event batches failed "
        f"{getattr(router.catalog, 'kv_errors', '-')}"
    )
    print(f"# donors now {len(router.catalog)}; pipeline {len(router.discovery)}; load {__import__('os').getloadavg()}")
    print(
        f"decide p50/p99/max {np.percentile(decide, 50):.2f} / {np.percentile(decide, 99):.2f} / {decide.max():.2f} ms"
    )
    print(f"glue   p50/p99/max {np.percentile(glue, 50):.2f} / {np.percentile(glue, 99):.2f} / {glue.max():.2f} ms")
    print(f"requests with glue > {args.slow_ms} ms: {(glue > args.slow_ms).sum()} of {len(glue)}")
    print(f"requests with decide > {args.slow_ms} ms: {(decide > args.slow_ms).sum()} of {len(decide)}")
    by_what: dict[str, list[tuple[float, float]]] = {}
    for what, thread, s, e, cpu in EVENTS:
        by_what.setdefault(f"{what} [{thread.split('_')[0]}]", []).append(((e - s) * 1e3, cpu * 1e3))
    print("\n| section [thread] | n | p50 ms | p99 ms | max ms | thread CPU p99 / max ms |\n|---|---|---|---|---|---|")
    for key, v in sorted(by_what.items()):
        a, c = np.array([w for w, _ in v]), np.array([t for _, t in v])
        cpu = f"{np.percentile(c, 99):.3f} / {c.max():.3f}" if not np.isnan(c).all() else "-"
        print(f"| {key} | {len(a)} | {np.percentile(a, 50):.3f} | {np.percentile(a, 99):.3f} | {a.max():.3f} | {cpu} |")
    for (start, end, d), g, t in zip(decisions, glue, decide, strict=True):
        if g <= args.slow_ms and t <= args.slow_ms:
            continue
        print(
            f"\n## slow request: glue {g:.2f} ms, decide {d['decide'] / 1e3:.2f}, stages "
            + ", ".join(f"{k} {v / 1e3:.2f}" for k, v in d.items())
        )
        for what, thread, s, e, cpu in EVENTS:
            if e > start and s < end and (e - s) * 1e3 > 0.3:
                print(
                    f"   {what:32s} {thread:28s} +{(s - start) * 1e3:7.2f} .. +{(e - start) * 1e3:7.2f} ms ({(e - s) * 1e3:.2f}, CPU {cpu * 1e3:.2f})"
                )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--donors", type=int, default=100_000)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--runtime-ms", type=float, default=0.4)
    p.add_argument("--gap-ms", type=float, default=5.0)
    p.add_argument("--slow-ms", type=float, default=3.0)
    p.add_argument("--spans-during-exact", type=int, default=1)
    p.add_argument("--trim-after", type=int, default=0, help="the indexer's TRIM_AFTER (0: as it is)")
    p.add_argument("--serve-kv", type=int, default=1)
    p.add_argument("--code", default=str(Path(__file__).resolve().parents[3]))
    asyncio.run(main(p.parse_args()))
