"""``DonorDiscovery.discover`` on the router's span path, section by section, cache-cold: session 17's request path
(``benchmarks/results/spans17/path_steps.py``: parse, ``decide`` with the runtime stand-in, the forwarded request,
the hint written to a real nats-server) with the discovery's ``discover`` replaced by a copy of main's (at 4109c5a)
that reads the loop thread's CPU (``time.thread_time``) between its sections; p50 / p90 µs over the requests. The
copy covers the router's call only (``known_spans`` given, ``embed=False``, a valid prompt of a known tenant). The
checkpoints add ~0.3-1 µs each; ``discover (whole)`` is the same call timed around it. Session 18, branch disc18.

Usage: ``python benchmarks/results/disc18/discover_steps.py TREE DONORS REQUESTS warm|cold``
"""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import asyncio
import gc
import socket
import subprocess
import sys
import time

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]
import nats
import numpy as np
import router_under_test as rut
from router_under_test import span_path_router, span_target

from semblend_dynamo import pipeline as pl

cpu = time.thread_time
STEPS: dict[str, list[float]] = {}


def mark(label, t0):
    t1 = cpu()
    STEPS.setdefault(label, []).append((t1 - t0) * 1e6)
    return cpu()


def instrumented(self):
    """main's discover and _result (router path), a checkpoint after each section."""

    def discover(
        request_id,
        namespace,
        tokens,
        *,
        exact_prefix_tokens=0,
        device_prefix_tokens=0,
        resident=None,
        embed=True,
        prompt_vector=None,
        known_spans=None,
        tenancy=None,
    ):
        w0 = t = cpu()
        timings = pl.StageTimings()
        t = mark("StageTimings()", t)
        digest = namespace.digest()
        t = mark("namespace.digest()", t)
        t0 = time.perf_counter()
        t = mark("perf_counter", t)
        target = pl._target(tokens)
        t = mark("_target", t)
        n = int(target.size)
        exact_wins = n > 0 and exact_prefix_tokens / n >= self.cfg.exact_route_threshold
        t = mark("size + exact test", t)
        timings.exact_check = pl._us(t0)
        t = mark("_us + store", t)
        assert n and not exact_wins
        refused = self.policy.may_seek(tenancy if tenancy is not None else pl.Tenancy.from_salt(namespace.cache_salt))
        t = mark("may_seek", t)
        assert refused is None
        t0 = time.perf_counter()
        spans = list(known_spans) if known_spans is not None else self._align(digest, target, resident)
        timings.align = pl._us(t0)
        t = mark("spans list + 2 clocks", t)
        t0 = time.perf_counter()
        decision = self.planner.plan(n, spans, device_prefix_tokens=device_prefix_tokens)
        timings.plan = pl._us(t0)
        t = mark("plan + 2 clocks", t)
        hits = {}
        embedded = False
        exact_plan = decision.plan is not None and decision.plan.mode == "exact"
        assert not (embed and self.embedder is not None and n > self.cfg.block_size and not exact_plan)
        t = mark("embed test", t)
        # _result, inlined
        covered = {}
        for s in spans:
            covered[s.donor_id] = covered.get(s.donor_id, 0) + s.length
        t = mark("_result: covered", t)
        if decision.plan is not None:
            used = {}
            for s in decision.plan.spans:
                used[s.donor_id] = used.get(s.donor_id, 0) + s.length
            primary = max(used, key=used.__getitem__)
        elif covered:
            primary = min(pl._rank(i, covered, hits) for i in covered)[2]
        else:
            above = [i for _, similarity, i in pl._ranked(covered, hits) if -similarity >= self.cfg.min_similarity]
            primary = above[0] if above else None
        t = mark("_result: primary", t)
        if decision.reason is not None:
            self.counters[pl._DECLINE_COUNTER[decision.reason]] += 1
        t = mark("_result: counter", t)
        out = pl.DiscoveryResult(
            request_id=request_id,
            namespace=digest,
            prompt_tokens=n,
            exact_prefix_tokens=exact_prefix_tokens,
            exact_wins=False,
            covered=covered,
            hits=hits,
            spans=spans,
            decision=decision,
            primary_donor=primary,
            best_similarity=max(hits.values()) if hits else None,
            embedded=embedded,
            timings_us=timings,
        )
        t = mark("_result: DiscoveryResult()", t)
        mark("discover (sections' sum, with checkpoints)", w0)
        return out

    return discover


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main():
    donors_n, n, cold = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "cold"
    port = free_port()
    srv = subprocess.Popen(
        ["nats-server", "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    await asyncio.sleep(0.5)
    router, donors, rng = await span_path_router(donors_n)
    runtime = rut.RuntimeStandIn(0.00025)
    kv = router.kv_router
    kv.get_overlap_scores = lambda token_ids, **_: runtime.ask(token_ids, lambda: {"workers": []})
    kv.get_potential_loads = lambda token_ids: runtime.ask(
        token_ids, lambda: [{"worker_id": rut.WORKER, "dp_rank": 0, "active_requests": 0}]
    )
    m = router.metrics
    router.publisher._on_sent = getattr(m, "event_out", None) or (lambda kind: m.events_out.labels(kind).inc())
    router.link._nc = await nats.connect(f"nats://127.0.0.1:{port}")
    disc = router.discovery
    inner = instrumented(disc)

    def timed(*a, **k):
        t0 = cpu()
        out = inner(*a, **k)
        STEPS.setdefault("discover (whole)", []).append((cpu() - t0) * 1e6)
        return out

    disc.discover = timed
    prompts = [span_target(rng, donors) for _ in range(n)]
    junk = np.ones(64 << 20, dtype=np.uint8)
    hinted = 0
    gc.disable()
    for i, p in enumerate(prompts[:20] + prompts):
        request = {"token_ids": p}
        await asyncio.sleep(0.002)
        if cold:
            junk += 1
        with router.gate.deciding():
            routed = router.parse(request, None)
            d = await router.decide(routed)
            router.forward_request(request, routed, d)
            await router._send_hint(d)
        if i < 20:
            STEPS.clear()
            continue
        hinted += d.hint is not None
    gc.enable()
    print(f"{TREE} {'cold' if cold else 'warm'} {donors_n} donors, {n} requests, {hinted} hinted")
    for k, v in STEPS.items():
        print(f"  {k}: p50 {np.percentile(v, 50):.1f} p90 {np.percentile(v, 90):.1f}")
    await router.link._nc.close()
    srv.terminate()


asyncio.run(main())
