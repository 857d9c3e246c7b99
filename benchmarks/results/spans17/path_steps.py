"""The semantic router's request path in process, step by step, as the Frontend runs it: parse, ``decide`` (the load
and exact queries answered by a stand-in of Dynamo's runtime ~250 µs after they are asked, on its own thread), the
forwarded request, the hint written to a real nats-server with the router's own ``on_sent``. Each step's time is the
loop thread's CPU (``time.thread_time``, µs) through a wrapper around the router's own method, p50 over the requests;
``cold``: 64 MB written through the caches before each request (through the Frontend the router's process waits
~20 ms between requests while the others run). Session 17, branch spans17.

Without ``steps`` (the last argument), no wrappers: the whole path's loop CPU and the router's own ``spans``,
``semantic`` and ``hint`` stages (wall), for A/B runs of two trees in turns.

Usage: ``python benchmarks/results/spans17/path_steps.py TREE DONORS REQUESTS warm|cold [steps]``
"""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import asyncio
import functools
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

cpu = time.thread_time
STEPS: dict[str, list[float]] = {}


def wrap(obj, name, label):
    fn = getattr(obj, name)
    if asyncio.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def timed_async(*a, **k):
            t0 = cpu()
            out = await fn(*a, **k)
            STEPS.setdefault(label, []).append((cpu() - t0) * 1e6)
            return out

        setattr(obj, name, timed_async)
    else:

        @functools.wraps(fn)
        def timed(*a, **k):
            t0 = cpu()
            out = fn(*a, **k)
            STEPS.setdefault(label, []).append((cpu() - t0) * 1e6)
            return out

        setattr(obj, name, timed)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main():
    donors_n, n, cold = int(sys.argv[2]), int(sys.argv[3]), len(sys.argv) > 4 and sys.argv[4] == "cold"
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
    steps = len(sys.argv) > 5 and sys.argv[5] == "steps"
    if steps:
        wrap(router, "_ask_loads", "ask_loads")
        wrap(router, "_ask_exact", "ask_exact")
        wrap(router, "_exact_may_win", "gate")
        wrap(router.catalog, "stored_together", "gate: stored_together")
        wrap(router.discovery.aligner._call, "run", "find_spans: AlignCall.run")
        wrap(router.discovery.aligner, "align", "find_spans: align")
        wrap(router.discovery.planner, "plan", "discover: plan")
        wrap(router.catalog, "resident_donor", "_semantic: resident_donor")
        wrap(router.publisher, "send_first", "_send_hint: send_first")
        wrap(router.discovery, "find_spans", "find_spans")
        wrap(router.discovery.aligner, "_spans_of", "spans_of")
        wrap(router, "_spans_during_exact", "span_path")
        wrap(router.discovery, "discover", "discover")
        wrap(router, "_hint", "_hint")
        wrap(router, "_within_load", "within_load")
        wrap(router, "_semantic", "_semantic")
        wrap(router.publisher, "encode", "encode")
        wrap(router.link, "publish_written", "publish_written")
        wrap(router, "_send_hint", "_send_hint")
        wrap(router, "parse", "parse")
        wrap(router, "forward_request", "forward")
    prompts = [span_target(rng, donors) for _ in range(n)]
    junk = np.ones(64 << 20, dtype=np.uint8)
    whole, hinted, stages = [], 0, {}
    gc.disable()
    for i, p in enumerate(prompts[:20] + prompts):
        request = {"token_ids": p}
        await asyncio.sleep(0.002)
        if cold:
            junk += 1
        c0 = cpu()
        with router.gate.deciding():
            routed = router.parse(request, None)
            d = await router.decide(routed)
            router.forward_request(request, routed, d)
            await router._send_hint(d)
        c1 = cpu()
        if i < 20:
            STEPS.clear()
            continue
        hinted += d.hint is not None
        whole.append((c1 - c0) * 1e6)
        for k in ("spans", "semantic", "hint"):
            stages.setdefault(k, []).append(d.latency_us[k])
    gc.enable()
    print(f"{TREE} {'cold' if cold else 'warm'} {donors_n} donors, {n} requests, {hinted} hinted")
    print(f"whole (loop CPU): p50 {np.percentile(whole, 50):.1f} p90 {np.percentile(whole, 90):.1f}")
    print(" ".join(f"{k} {np.percentile(v, 50):.1f}" for k, v in stages.items()), "(stages, wall µs p50)")
    for k, v in STEPS.items():
        print(f"  {k}: p50 {np.percentile(v, 50):.1f} p90 {np.percentile(v, 90):.1f}")
    await router.link._nc.close()
    srv.terminate()


asyncio.run(main())
