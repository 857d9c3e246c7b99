"""The semantic router's span path in process (tree in argv[1]): parse, decide, the hint written to a real nats-server,
with the router's own on_sent wiring; stage p50/p99 (µs) and the loop thread's CPU per request."""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import asyncio
import socket
import subprocess
import sys
import time

TREE = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 400
sys.path[:0] = [TREE, TREE + "/benchmarks"]
import nats
import numpy as np
from router_under_test import span_path_router, span_target


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main():
    port = free_port()
    srv = subprocess.Popen(
        ["nats-server", "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    await asyncio.sleep(0.5)
    router, donors, rng = await span_path_router(2000)
    m = router.metrics
    router.publisher._on_sent = getattr(m, "event_out", None) or (lambda kind: m.events_out.labels(kind).inc())
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    router.link._nc = nc
    prompts = [span_target(rng, donors) for _ in range(N)]
    stages, cpu = {}, []
    for i, p in enumerate(prompts + prompts[:50]):
        await asyncio.sleep(0.002)
        c0 = time.thread_time()
        routed = router.parse({"token_ids": p}, None)
        d = await router.decide(routed)
        router.forward_request({"token_ids": p}, routed, d)
        await router._send_hint(d)
        c1 = time.thread_time()
        if i < 50:
            continue
        cpu.append((c1 - c0) * 1e6)
        lat = d.latency_us
        lat["glue"] = lat["decide"] - lat["ask_loads"] - lat["exact"] - lat["semantic"]
        for k, v in lat.items():
            stages.setdefault(k, []).append(v)
    keys = ["spans", "semantic", "glue", "hint", "decide"]
    print(
        " ".join(f"{k} {np.percentile(stages[k], 50):.1f}/{np.percentile(stages[k], 99):.1f}" for k in keys),
        f"cpu {np.percentile(cpu, 50):.0f}/{np.percentile(cpu, 99):.0f}",
        "hinted",
        len(stages["hint"]),
    )
    await nc.close()
    srv.terminate()


asyncio.run(main())
