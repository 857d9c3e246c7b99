"""`EvidencePublisher.send_first` of a 1-span hint to a real nats-server and its parts, µs per call (best of 5 x 3,000),
in the tree given, with the router's own `on_sent` (`RouterMetrics.event_out` where the tree has it, else the lambda
the router had): the whole call, `publish_written`, the socket write alone, the encoding, the `on_sent` count.

Usage: `python benchmarks/results/sem16/send.py TREE` (or through `ab.sh`)
"""

# ruff: noqa: E402  (the tree given goes first on the path before its imports)

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import timeit

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.publisher import EvidencePublisher
from semblend_dynamo.events.schemas import DonorHint
from semblend_dynamo.events.subjects import Subjects
from semblend_dynamo.outcomes import Outcome
from semblend_dynamo.router.metrics import RouterMetrics


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
    cfg = SemblendConfig(nats_url=f"nats://127.0.0.1:{port}")
    link = NatsLink(cfg, name="b")
    link.start()
    await asyncio.wait_for(link.wait_connected(), 10)
    metrics = RouterMetrics()
    pub = EvidencePublisher(
        link,
        queue_size=1 << 16,
        on_sent=getattr(metrics, "event_out", None) or (lambda kind: metrics.events_out.labels(kind).inc()),
    )
    subject = Subjects.for_config(cfg).hints(0x1234)
    hint = DonorHint(
        request_key="0123456789abcdef",
        request_id="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        donor_id="d123",
        donor_key="fedcba9876543210",
        worker_id=0x1234,
        namespace="0011223344556677",
        spans=[(0, 2048, 512)],
        decision=Outcome.SEMANTIC_PLACEMENT,
        trace_id="abcdef0123456789",
    )
    data = pub.encode(hint)
    N = 3000

    def run(coro_fn):
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(N):
                c = coro_fn()
                with contextlib.suppress(StopIteration):
                    c.send(None)
            best.append((time.perf_counter() - t0) / N * 1e6)
            # let nats-server drain
        return min(best)

    res = {}
    for _ in range(2):
        res["send_first"] = run(lambda: pub.send_first(subject, hint, 0.005))
        await asyncio.sleep(0.2)
        res["publish_written"] = run(lambda: link.publish_written(subject, data, 0.005))
        await asyncio.sleep(0.2)
    writer = link._nc._transport._io_writer
    from nats.protocol.command import pub_cmd

    def raw():
        writer.write(pub_cmd(subject, "", data))

    res["raw write"] = min(timeit.repeat(raw, number=N, repeat=5)) / N * 1e6
    await asyncio.sleep(0.2)
    res["encode"] = min(timeit.repeat(lambda: pub.encode(hint), number=N, repeat=5)) / N * 1e6
    res["on_sent"] = min(timeit.repeat(lambda: pub._on_sent("hint"), number=N, repeat=5)) / N * 1e6
    for k, v in res.items():
        print(f"{k}: {v:.2f} us")
    srv.terminate()


asyncio.run(main())
