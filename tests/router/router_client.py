"""A test client: sends PreprocessedRequest dicts to the router endpoint through the Dynamo runtime.

Run as a subprocess: ``python -m tests.router.router_client --endpoint ns.semblend.generate --requests in.json
--out out.jsonl [--interval-s 0.1] [--instance <router connection id>]``. One JSON line per request:
``{"i", "ok", "error", "worker_id", "chunks", "latency_ms"}``. It uses the zmq event plane, so it neither needs nor waits
for NATS (requests travel on the TCP request plane).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from dynamo.runtime import DistributedRuntime


async def main(args: argparse.Namespace) -> None:
    drt = DistributedRuntime(
        asyncio.get_running_loop(), os.environ.get("DYN_DISCOVERY_BACKEND", "file"), "tcp", event_plane="zmq"
    )
    client = await drt.endpoint(args.endpoint).client()
    await asyncio.wait_for(client.wait_for_instances(), timeout=30)
    if args.instance:
        deadline = time.monotonic() + 30
        while args.instance not in client.instance_ids() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    with open(args.requests) as f:
        requests: list[dict[str, Any]] = json.load(f)
    with open(args.out, "w") as out:
        for i, request in enumerate(requests):
            result: dict[str, Any] = {"i": i, "ok": False, "error": None, "worker_id": None, "chunks": 0}
            started = time.perf_counter()
            try:
                if args.instance:
                    stream = await client.direct(request, args.instance)
                else:
                    stream = await client.round_robin(request)
                async for chunk in stream:
                    data = chunk.data() if hasattr(chunk, "data") else chunk
                    result["chunks"] += 1
                    worker = ((data or {}).get("routing_data") or {}).get("worker_id") or {}
                    result["worker_id"] = result["worker_id"] or worker.get("decode_worker_id")
                result["ok"] = result["chunks"] > 0
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
            result["latency_ms"] = (time.perf_counter() - started) * 1e3
            out.write(json.dumps(result) + "\n")
            out.flush()
            await asyncio.sleep(args.interval_s)
    drt.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--requests", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--interval-s", type=float, default=0.0)
    p.add_argument("--instance", type=int, default=0)
    asyncio.run(main(p.parse_args()))
