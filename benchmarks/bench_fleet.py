"""Fleet scale: 64 workers publishing real KV events, a ramp of resident donors, two router replicas and a late one.

Everything runs as real processes on the NATS event plane (``DYN_EVENT_PLANE=nats``, file discovery):

* ``--mockers`` stock ``python -m dynamo.mocker --engine-type trtllm`` workers (Dynamo's engine emulation and its
  own KV publisher), each driven with real requests (Dynamo's request plane) so it stores, evicts and publishes;
  their RSS is measured per process;
* the rest of the 64 workers in ONE emulator process (``--emulator``): each is its own Dynamo
  ``DistributedRuntime`` (its own discovery instance, i.e. a live worker id) serving ``generate``, with Dynamo's
  ``KvEventPublisher`` (local indexer on, as Dynamo's default); it publishes the donors' blocks and a steady churn
  of stored+removed blocks at ``--churn-events`` events/s for the whole fleet;
* donors enter the routers as a peer router registers them: ``DonorRegistration`` messages on the
  ``semblend.donors`` subject (codec of ``events/codec.py``; float16 embeddings of the hash embedder's dim), each
  naming ``--donor-blocks`` Dynamo ``tokens_hash`` es that its worker published (``--shared-blocks`` of them a
  per-worker shared prefix), so every donor is resident on a live worker;
* router replicas A and B (``python -m semblend_dynamo.router``) run from the start; after each step of the ramp a
  replica C is started and timed until its catalog equals A's (donor and resident counts, and the per-worker donor
  gauges; at the first step the full ``/debug/donors``); it then stops.

Per step it prints each replica's RSS and peak RSS (``/proc/<pid>/status`` VmRSS / VmHWM), the ingest lag of the
kv-events stream (``semblend_router_kv_ingest_lag_seconds``: applied minus the publisher's ``published_at``) over a
``--window`` of churn only, and C's convergence; the baseline is the same replicas' RSS before any donor, measured in
the same run, and the mocker/emulator/nats RSS.

Usage: ``.venv/bin/python benchmarks/bench_fleet.py [--donors 10000 100000 300000 1000000] [--mockers 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK = 16
MODEL = "tiny"
CONTROL = "semblend_bench.fleet.control"


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


# --- the emulator process ------------------------------------------------------------------------
def donor_tokens(worker: int, donor: int, shared_blocks: int, donor_blocks: int) -> list[int]:
    """Deterministic tokens: a per-worker shared prefix, then the donor's own blocks."""
    prefix = [(worker * 7919 + i) % 30000 + 100 for i in range(shared_blocks * BLOCK)]
    own = [(donor * 104729 + i * 31) % 30000 + 100 for i in range((donor_blocks - shared_blocks) * BLOCK)]
    return prefix + own


async def emulator(args: argparse.Namespace) -> None:
    import nats
    from dynamo.llm import (
        KvEventPublisher,
        ModelInput,
        ModelRuntimeConfig,
        ModelType,
        WorkerType,
        compute_block_hash_for_seq,
        register_model,
    )
    from dynamo.runtime import DistributedRuntime

    from semblend_dynamo.config import SemblendConfig
    from semblend_dynamo.events.codec import encode
    from semblend_dynamo.events.schemas import DonorRegistration, deployment_digest
    from semblend_dynamo.namespace import ModelIdentity

    loop = asyncio.get_running_loop()
    cfg = SemblendConfig(model_id=MODEL, block_size=BLOCK, embedder="hash")
    ns = ModelIdentity.from_config(cfg).namespace()
    deployment, namespace = deployment_digest(ns), ns.digest()
    donors_subject = f"namespace.{args.worker_ns}.component.backend.endpoint.generate.semblend.donors"

    async def generate(request: dict[str, Any], context: Any = None) -> Any:
        yield {"token_ids": [7], "finish_reason": "stop"}

    workers: list[tuple[int, Any]] = []
    runtimes = []
    serving = []
    for _ in range(args.workers):
        drt = DistributedRuntime(loop, "file", "tcp", event_plane="nats")
        ep = drt.endpoint(f"{args.worker_ns}.backend.generate")
        serving.append(asyncio.ensure_future(ep.serve_endpoint(generate)))
        runtime_config = ModelRuntimeConfig()
        runtime_config.total_kv_blocks = 1 << 20
        # A model card with a runtime config, as a worker registers: Dynamo's KvRouter then knows the worker and
        # recovers its blocks from its local indexer (what a replica started late relies on).
        await register_model(
            ModelInput.Tokens,
            ModelType.Completions,
            ep,
            MODEL,
            MODEL,
            worker_type=WorkerType.Aggregated,
            kv_cache_block_size=BLOCK,
            runtime_config=runtime_config,
            skip_model_assets=True,
        )
        publisher = KvEventPublisher(ep, kv_block_size=BLOCK, enable_local_indexer=True)
        runtimes.append(drt)
        workers.append((ep.connection_id(), publisher))
    mocker_client = None
    if args.mocker_ids:
        mocker_client = await runtimes[0].endpoint(f"{args.worker_ns}.backend.generate").client()
    nc = await nats.connect(os.environ["NATS_SERVER"], max_reconnect_attempts=-1)
    rng = np.random.default_rng(0)
    state = {"donors": 0, "churn_events": 0, "mocker_requests": 0, "mocker_errors": 0}
    next_engine_id = [1 << 40]

    def engine_ids(n: int) -> list[int]:
        start = next_engine_id[0]
        next_engine_id[0] += n
        return list(range(start, start + n))

    # The per-worker shared prefix, stored once.
    prefix_ids: dict[int, list[int]] = {}
    for w, (_, publisher) in enumerate(workers):
        if args.shared_blocks:
            tokens = donor_tokens(w, 0, args.shared_blocks, args.shared_blocks)
            prefix_ids[w] = engine_ids(args.shared_blocks)
            publisher.publish_stored(
                token_ids=tokens, num_block_tokens=[BLOCK] * args.shared_blocks, block_hashes=prefix_ids[w]
            )

    async def add_donors(upto: int) -> None:
        own = args.donor_blocks - args.shared_blocks
        batch: list[bytes] = []
        started, first = time.perf_counter(), state["donors"]
        for d in range(state["donors"], upto):
            w = d % len(workers)
            worker_id, publisher = workers[w]
            tokens = donor_tokens(w, d, args.shared_blocks, args.donor_blocks)
            parent = prefix_ids[w][-1] if args.shared_blocks else None
            publisher.publish_stored(
                token_ids=tokens[args.shared_blocks * BLOCK :],
                num_block_tokens=[BLOCK] * own,
                block_hashes=engine_ids(own),
                parent_hash=parent,
            )
            emb, dim = DonorRegistration.pack_embedding(rng.standard_normal(args.dim).astype(np.float32))
            reg = DonorRegistration(
                donor_id=f"{worker_id:x}:{namespace}:{d:016x}",
                donor_key=f"{d:016x}",
                router_id="fleet-peer",
                worker_id=worker_id,
                deployment=deployment,
                namespace=namespace,
                num_tokens=len(tokens),
                block_size=BLOCK,
                block_hashes=compute_block_hash_for_seq(tokens, BLOCK),
                embedding=emb,
                embedding_dim=dim,
            )
            batch.append(encode(reg))
            if len(batch) >= 500:
                await asyncio.sleep(0.05)  # the blocks go first (the publisher batches them), then the registrations
                for data in batch:
                    await nc.publish(donors_subject, data)
                await nc.flush(timeout=120)
                batch = []
                # paced: a burst beyond what replicas index gets them cut off by nats-server as slow consumers
                ahead = started + (d + 1 - first) / args.register_rate - time.perf_counter()
                await asyncio.sleep(max(ahead, 0.0))
            state["donors"] = d + 1
        await asyncio.sleep(0.05)
        for data in batch:
            await nc.publish(donors_subject, data)
        await nc.flush(timeout=120)

    async def churn() -> None:
        """Stored then removed blocks (generation blocks coming and going) at the fleet's event rate."""
        interval = 1.0 / max(args.churn_events, 1e-9)
        start, i = time.perf_counter(), 0
        live: list[list[int]] = [[] for _ in workers]
        while True:
            delay = start + i * interval - time.perf_counter()
            if delay < -1.0:  # fell behind (a donor batch held the loop): keep the rate, drop the backlog
                start, i, delay = time.perf_counter(), 0, 0.0
            await asyncio.sleep(max(delay, 0.0))
            w = i % len(workers)
            _, publisher = workers[w]
            if live[w] and (i // len(workers)) % 2:
                publisher.publish_removed(block_hashes=live[w])
                live[w] = []
            else:
                ids = engine_ids(args.churn_blocks)
                tokens = [int(t) for t in rng.integers(100, 30000, size=args.churn_blocks * BLOCK)]
                publisher.publish_stored(
                    token_ids=tokens, num_block_tokens=[BLOCK] * args.churn_blocks, block_hashes=ids
                )
                live[w] = ids
            state["churn_events"] += 1
            i += 1

    async def drive_mockers() -> None:
        """Real requests to the stock mockers (Dynamo's request plane), so they store, evict and publish."""
        assert mocker_client is not None
        await mocker_client.wait_for_instances()
        interval = 1.0 / max(args.mocker_rps, 1e-9)
        i = 0
        while True:
            await asyncio.sleep(interval)
            target = args.mocker_ids[i % len(args.mocker_ids)]
            shared = [100 + (i % 8)] * 256  # some prompts share a prefix, so prefix caching and eviction both happen
            tokens = shared + [int(t) for t in rng.integers(100, 30000, size=256)]
            request = {
                "model": MODEL,
                "token_ids": tokens,
                "stop_conditions": {"max_tokens": 4},
                "sampling_options": {},
                "output_options": {},
                "eos_token_ids": [],
                "annotations": [],
            }
            try:
                async for _ in await mocker_client.direct(request, target):
                    pass
                state["mocker_requests"] += 1
            except Exception:
                state["mocker_errors"] += 1
            i += 1

    async def control(msg: Any) -> None:
        cmd = json.loads(msg.data)
        reply: dict[str, Any] = {}
        if cmd["cmd"] == "donors":
            try:
                await add_donors(int(cmd["upto"]))
            except Exception as exc:  # reported to the orchestrator, which stops the run
                reply["error"] = repr(exc)
        reply.update(state, worker_ids=[w for w, _ in workers])
        await msg.respond(json.dumps(reply).encode())

    await nc.subscribe(CONTROL, cb=control)
    await nc.flush()
    tasks = [asyncio.ensure_future(churn())]
    if mocker_client is not None:
        tasks.append(asyncio.ensure_future(drive_mockers()))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("EMULATOR_READY", flush=True)
    await stop.wait()
    for task in tasks + serving:
        task.cancel()
    await nc.close()
    for (_, publisher), drt in zip(workers, runtimes, strict=True):
        publisher.shutdown()
        drt.shutdown()


# --- the orchestrator ----------------------------------------------------------------------------
class Replica:
    """A router replica process and its HTTP endpoints."""

    def __init__(self, graph: Any, name: str) -> None:
        from tests.support.nats import free_port

        self.name = name
        self.port = free_port()
        env = dict(graph.env)
        env.update(
            {
                "SEMBLEND_NATS_URL": graph.nats.url,
                "SEMBLEND_DYNAMO_NAMESPACE": graph.worker_ns,
                "SEMBLEND_ROUTER_NAMESPACE": graph.frontend_ns,
                "SEMBLEND_WORKER_COMPONENT": "backend",
                "SEMBLEND_MODEL_ID": MODEL,
                "SEMBLEND_BLOCK_SIZE": str(BLOCK),
                "SEMBLEND_EMBEDDER": "hash",
                "SEMBLEND_REGISTER_MODEL": "0",
                "SEMBLEND_INDEX_CAPACITY": str(graph.capacity),
                "SEMBLEND_METRICS_HOST": "127.0.0.1",
                "SEMBLEND_METRICS_PORT": str(self.port),
                "DYN_LOG": "warn",
            }
        )
        self.started = time.monotonic()
        self.process = graph._start(name, [sys.executable, "-m", "semblend_dynamo.router"], env)
        self.ready_s = 0.0

    def wait_ready(self, timeout: float = 120) -> None:
        from tests.support.dynamo_graph import wait_until

        wait_until(lambda: "SEMBLEND_ROUTER_READY" in self.process.log(), timeout, what=f"{self.name} ready")
        self.ready_s = time.monotonic() - self.started

    def get(self, path: str, timeout: float = 60) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as resp:
            body = resp.read()
        return body.decode() if path == "/metrics" else json.loads(body)

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics`` keyed by its full name with labels."""
        out = {}
        for line in self.get("/metrics").splitlines():
            if line and not line.startswith("#"):
                head, value = line.rsplit(" ", 1)
                out[head] = float(value)
        return out

    def rss(self) -> tuple[float, float]:
        return rss_mb(self.process.proc.pid)


def donor_gauges(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("semblend_router_donors{")}


def resident(metrics: dict[str, float]) -> float:
    return sum(v for k, v in donor_gauges(metrics).items() if 'state="resident"' in k)


def lag_quantiles(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean and bucket-bound p50/p99 of the ingest lag between two scrapes."""
    name = "semblend_router_kv_ingest_lag_seconds"
    count = after.get(f"{name}_count", 0) - before.get(f"{name}_count", 0)
    total = after.get(f"{name}_sum", 0) - before.get(f"{name}_sum", 0)
    buckets = sorted(
        (float(k.split('le="')[1].rstrip('"}')), after[k] - before.get(k, 0))
        for k in after
        if k.startswith(f"{name}_bucket")
    )
    out = {"messages": count, "mean_ms": total / count * 1e3 if count else float("nan")}
    for q in (50, 99):
        bound = next((le for le, c in buckets if c >= count * q / 100), float("inf"))
        out[f"p{q}_le_ms"] = bound * 1e3
    return out


def converge(late: Replica, reference: Replica, n: int, timeout: float) -> float:
    """Seconds from C's spawn until its catalog equals the reference's (counts, then per-worker gauges)."""
    deadline = late.started + timeout
    while time.monotonic() < deadline:
        try:
            health = late.get("/healthz", timeout=5)
        except OSError:
            time.sleep(0.1)
            continue
        if health.get("donors") == n:
            m = late.metrics()
            if resident(m) == n and donor_gauges(m) == donor_gauges(reference.metrics()):
                return time.monotonic() - late.started
        time.sleep(0.1)
    m = late.metrics()
    raise TimeoutError(
        f"{late.name} did not converge on {n} donors within {timeout}s: holds {late.get('/healthz')['donors']}, "
        f"{resident(m):.0f} resident, {m.get('semblend_router_kv_block_events_total', 0):.0f} blocks applied"
    )


def control(url: str, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
    import nats

    async def go() -> dict[str, Any]:
        nc = await nats.connect(url)
        try:
            msg = await nc.request(CONTROL, json.dumps(cmd).encode(), timeout=timeout)
            return dict(json.loads(msg.data))
        finally:
            await nc.close()

    return asyncio.run(go())


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise TimeoutError(what)


def bench(args: argparse.Namespace) -> None:
    from tests.support.dynamo_graph import DynamoGraph, wait_until

    graph = DynamoGraph("nats", name="fleet")
    graph.capacity = max(args.donors) + 1000
    rows: list[dict[str, Any]] = []
    try:
        mockers = [graph.start_mocker(gpu_blocks=args.mocker_blocks) for _ in range(args.mockers)]
        emulated = args.workers - args.mockers
        cmd = [sys.executable, __file__, "--emulator", "--worker-ns", graph.worker_ns, "--workers", str(emulated)]
        cmd += ["--churn-events", str(args.churn_events), "--churn-blocks", str(args.churn_blocks)]
        cmd += ["--donor-blocks", str(args.donor_blocks), "--shared-blocks", str(args.shared_blocks)]
        cmd += ["--register-rate", str(args.register_rate)]
        cmd += ["--mocker-rps", str(args.mocker_rps), "--mocker-ids", *[str(m.worker_id) for m in mockers]]
        emu = graph._start("emulator", cmd)
        wait_until(lambda: "EMULATOR_READY" in emu.log(), timeout=300, what="emulator ready", of=emu)
        wait_until(
            lambda: len(graph.instances(graph.worker_ns)) >= args.workers, timeout=60, what="64 workers in discovery"
        )
        a, b = Replica(graph, "replica-a"), Replica(graph, "replica-b")
        a.wait_ready()
        b.wait_ready()
        time.sleep(args.window)
        base = {r.name: r.rss() for r in (a, b)}
        m0 = {r.name: r.metrics() for r in (a, b)}
        time.sleep(args.window)
        m1 = {r.name: r.metrics() for r in (a, b)}
        print(f"# hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
        print(f"# workers: {args.workers} ({args.mockers} stock mockers + {emulated} emulated in one process)")
        for m in mockers:
            print(f"# mocker {m.worker_id:x} RSS {rss_mb(m.process.proc.pid)[0]:.0f} MB")
        print(f"# emulator ({emulated} workers) RSS {rss_mb(emu.proc.pid)[0]:.0f} MB; nats RSS ", end="")
        print(f"{rss_mb(graph.nats.proc.pid)[0]:.0f} MB")  # type: ignore[union-attr]
        for r in (a, b):
            lag = lag_quantiles(m0[r.name], m1[r.name])
            print(
                f"# baseline {r.name}: 0 donors RSS {base[r.name][0]:.0f} MB, ingest "
                f"{lag['messages'] / args.window:.0f} msg/s lag mean {lag['mean_ms']:.1f} ms p99 <= {lag['p99_le_ms']:.0f} ms"
            )
        for step, n in enumerate(args.donors):
            t0 = time.monotonic()
            state = control(graph.nats.url, {"cmd": "donors", "upto": n}, timeout=1800)
            published_s = time.monotonic() - t0
            if "error" in state:
                raise RuntimeError(f"emulator failed adding donors: {state['error']}")
            for r in (a, b):
                wait_for(lambda r=r, n=n: r.get("/healthz")["donors"] >= n, args.timeout, f"{r.name} holds {n} donors")
                wait_for(lambda r=r, n=n: resident(r.metrics()) >= n, args.timeout, f"{r.name}: {n} resident")
            ingested_s = time.monotonic() - t0
            m0 = {r.name: r.metrics() for r in (a, b)}
            time.sleep(args.window)
            m1 = {r.name: r.metrics() for r in (a, b)}
            rss = {r.name: r.rss() for r in (a, b)}
            late = Replica(graph, f"replica-c{step}")
            late.wait_ready()
            converge_s = converge(late, a, n, args.timeout)
            if step == 0:
                assert late.get("/debug/donors") == a.get("/debug/donors"), "late replica's catalog differs"
            late_rss = late.rss()
            late.process.stop()
            row = {
                "donors": n,
                "published_s": published_s,
                "ingested_s": ingested_s,
                "churn_events": state["churn_events"],
                "mocker_requests": state["mocker_requests"],
                "mocker_errors": state["mocker_errors"],
                "late_ready_s": late.ready_s,
                "late_converge_s": converge_s,
                "late_rss_mb": late_rss[0],
                "late_peak_mb": late_rss[1],
            }
            for r in (a, b):
                lag = lag_quantiles(m0[r.name], m1[r.name])
                row[f"{r.name}_rss_mb"], row[f"{r.name}_peak_mb"] = rss[r.name]
                row[f"{r.name}_lag"] = lag
                row[f"{r.name}_msg_per_s"] = lag["messages"] / args.window
            rows.append(row)
            print(json.dumps(row), flush=True)
        print_table(base, rows)
    finally:
        graph.close()


def print_table(base: dict[str, tuple[float, float]], rows: list[dict[str, Any]]) -> None:
    print(
        "\n| resident donors | replica A RSS MB (peak) | replica B RSS MB (peak) | A ingest msg/s | A lag mean / p99 ms "
        "| B lag mean / p99 ms | late replica: ready s | converged s | its RSS MB (peak) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    a0, b0 = base["replica-a"][0], base["replica-b"][0]
    print(f"| 0 (baseline) | {a0:.0f} | {b0:.0f} | | | | | | |")
    for r in rows:
        la, lb = r["replica-a_lag"], r["replica-b_lag"]
        print(
            f"| {r['donors']:,} | {r['replica-a_rss_mb']:.0f} ({r['replica-a_peak_mb']:.0f}) "
            f"| {r['replica-b_rss_mb']:.0f} ({r['replica-b_peak_mb']:.0f}) | {r['replica-a_msg_per_s']:.0f} "
            f"| {la['mean_ms']:.1f} / <={la['p99_le_ms']:.0f} | {lb['mean_ms']:.1f} / <={lb['p99_le_ms']:.0f} "
            f"| {r['late_ready_s']:.1f} | {r['late_converge_s']:.1f} | {r['late_rss_mb']:.0f} ({r['late_peak_mb']:.0f}) |"
        )
    if len(rows) >= 2:
        slope = (rows[-1]["replica-a_rss_mb"] - rows[0]["replica-a_rss_mb"]) / (rows[-1]["donors"] - rows[0]["donors"])
        print(f"\nRSS slope (replica A, first to last step): {slope * 1e6 / 1024:.2f} KB per donor")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--donors", type=int, nargs="+", default=[10_000, 100_000, 300_000, 1_000_000])
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--mockers", type=int, default=4, help="stock dynamo.mocker processes among the workers")
    p.add_argument("--mocker-blocks", type=int, default=1024)
    p.add_argument("--mocker-rps", type=float, default=8.0, help="requests/s sent to the mockers, all together")
    p.add_argument("--churn-events", type=float, default=640.0, help="emulated workers' churn, events/s in all")
    p.add_argument("--churn-blocks", type=int, default=4, help="blocks per churn event")
    p.add_argument("--donor-blocks", type=int, default=4, help="blocks per donor (its whole prompt)")
    p.add_argument("--shared-blocks", type=int, default=2, help="of which a per-worker shared prefix")
    p.add_argument("--register-rate", type=float, default=1000.0, help="donor registrations/s (peer router's rate)")
    p.add_argument("--dim", type=int, default=384, help="embedding dim (the hash embedder's)")
    p.add_argument("--window", type=float, default=10.0, help="seconds of churn over which the lag is measured")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--emulator", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-ns", help=argparse.SUPPRESS)
    p.add_argument("--mocker-ids", type=int, nargs="*", default=[], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.emulator:
        asyncio.run(emulator(args))
    else:
        bench(args)


if __name__ == "__main__":
    main()
