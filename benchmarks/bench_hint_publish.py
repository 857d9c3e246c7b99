"""What publishing a hint costs the request: ``EvidencePublisher.send_first`` against a real nats-server.

A nats-server on a free loopback port, a listener on the hint subject (its own process, so its reading takes no time
from the publisher's loop), and ``--hints`` hints of a 16-span ``DonorHint`` sent one at a time, each timed from the
call to its return (the request waits for this before it is forwarded), with a timer on the loop beside them that
wakes every 0.5 ms (a router's loop is never idle: NATS readers, Dynamo's callbacks). Reports p50/p99 in µs and
how many loop iterations ran during each call.

``--compare REF`` runs the code of git ``REF`` as the baseline, in turns with this tree, each in its own process.

Usage: ``.venv/bin/python benchmarks/bench_hint_publish.py [--hints 3000] [--repeat 3] [--compare main]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from router_under_test import ROOT, export_ref, use_code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def child(args: argparse.Namespace) -> dict[str, Any]:
    use_code(args.code)
    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.events.link import NatsLink
    from semblend_dynamo.events.publisher import EvidencePublisher
    from semblend_dynamo.events.schemas import DonorHint
    from semblend_dynamo.events.subjects import Subjects
    from semblend_dynamo.outcomes import Outcome

    cfg = SemblendConfig(nats_url=args.url)
    subject = Subjects.for_config(cfg).hints(7)
    link = NatsLink(cfg, name="bench-hint")
    link.start()
    await asyncio.wait_for(link.wait_connected(), 10)
    publisher = EvidencePublisher(link, queue_size=1 << 16)
    hint = DonorHint(
        request_key="k" * 32,
        request_id="r",
        donor_id="d",
        worker_id=7,
        namespace="n" * 16,
        spans=[(i * 512, 2048 + i * 512, 512) for i in range(16)],
        decision=Outcome.SEMANTIC_PLACEMENT,
        trace_id="t" * 16,
    )
    turns = 0

    def tick() -> None:
        nonlocal turns
        turns += 1
        loop.call_later(0.0005, tick)

    loop = asyncio.get_running_loop()
    loop.call_soon(tick)
    times: list[float] = []
    iterations: list[int] = []
    for i in range(args.hints + 100):
        await asyncio.sleep(0.001)
        before = turns
        t0 = time.perf_counter()
        await publisher.send_first(subject, hint, 0.005)
        if i >= 100:
            times.append((time.perf_counter() - t0) * 1e6)
            iterations.append(turns - before)
    await link.close()
    return {"us": times, "ticks": iterations, "sent": publisher.sent["hint"]}


def listen(url: str, subject: str) -> subprocess.Popen[bytes]:
    code = (
        "import asyncio, nats\n"
        "async def main():\n"
        f"    nc = await nats.connect({url!r})\n"
        "    async def cb(msg): pass\n"
        f"    await nc.subscribe({subject!r}, cb=cb)\n"
        "    await nc.flush()\n"
        "    print('ready', flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def parent(args: argparse.Namespace) -> None:
    server_bin = shutil.which("nats-server")
    assert server_bin, "nats-server is missing"
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    server = subprocess.Popen([server_bin, "-a", "127.0.0.1", "-p", str(port)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    sys.path.insert(0, str(ROOT))
    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.events.subjects import Subjects

    listener = listen(url, Subjects.for_config(SemblendConfig(nats_url=url)).hints(7))
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            codes = [("this tree (after)", str(ROOT))]
            if args.compare:
                export_ref(args.compare, tmp)
                codes.insert(0, (f"{args.compare} (before)", tmp))
            for turn in range(1, args.repeat + 1):
                for label, code in codes:
                    cmd = [sys.executable, __file__, "--child", "--code", code, "--url", url]
                    cmd += ["--hints", str(args.hints)]
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                    result = json.loads(out.splitlines()[-1])
                    us, ticks = np.asarray(result["us"]), np.asarray(result["ticks"])
                    rows.append(
                        f"| {label}, run {turn} | {np.percentile(us, 50):.1f} / {np.percentile(us, 99):.1f} | "
                        f"{ticks.mean():.2f} |"
                    )
    finally:
        listener.kill()
        server.kill()
    print(
        f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.1f}; {args.hints} hints per run"
    )
    print()
    print("| code | send_first µs p50 / p99 | timer wake-ups during a call (mean) |")
    print("|---|---|---|")
    print("\n".join(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hints", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each code, in turns")
    parser.add_argument("--compare", default="", help="a git ref whose code runs as the baseline")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--code", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args))))
    else:
        parent(args)


if __name__ == "__main__":
    main()
