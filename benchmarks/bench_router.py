"""Router benchmarks: semantic-stage latency at 8K tokens with 10K/100K donors, and KV-event ingest.

Every figure is printed next to a baseline measured in the same run:

* ``stage``: the router's semantic stage (token-exact spans first, the prompt embedding only when they find
  nothing; the router computes that embedding on its embedding worker, here it is computed inline) for an 8,192-token prompt, with N donors indexed (512-token
  donors, every one resident): ``spans`` = the prompt reorders 8 donors among random tokens; ``no spans`` = a
  prompt sharing no span with any donor, so the embedding search runs. Baseline: the exact-only path of the
  same request in-process (``compute_block_hash_for_seq`` + Dynamo ``RadixTree.find_matches`` over the same
  donors' blocks).
* ``ingest``: Dynamo kv-events (16-block stored events, 1 in 4 followed by a removal) decoded and applied to
  the router's residency, in-process; baselines: msgpack unpacking alone, and Dynamo's own ``RadixTree``
  fed the same events (the JSON path of Dynamo 1.6's KV events).
* ``ingest-nats``: the same stream published through a real nats-server at a fixed offered rate by a
  separate process, consumed by the router's subscriber + residency; reports the achieved rate and the
  lag (receive time - ``published_at``) in the first and last second, to show whether lag grows.
* ``e2e`` (``--e2e``): the router's added latency end to end through Dynamo: test workers, the router with
  N donors registered over NATS, 8K-token requests; baseline: a second router with ``SEMBLEND_ENABLED=0``
  (exact-only) on the same workers, same requests.

Usage: ``.venv/bin/python benchmarks/bench_router.py [--donors 10000 100000] [--e2e] [--embedder hash|minilm]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
from dynamo.llm import RadixTree, compute_block_hash_for_seq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from semblend_dynamo.config import SemblendConfig  # noqa: E402
from semblend_dynamo.embedder import build_embedder  # noqa: E402
from semblend_dynamo.events.codec import decode_kv_events  # noqa: E402
from semblend_dynamo.events.schemas import DonorRegistration  # noqa: E402
from semblend_dynamo.namespace import NamespaceKey  # noqa: E402
from semblend_dynamo.pipeline import DiscoveryResult, DonorDiscovery  # noqa: E402
from semblend_dynamo.router.residency import Residency  # noqa: E402
from semblend_dynamo.tokenizer import TokenizerAdapter  # noqa: E402

BLOCK = 32
DONOR_TOKENS = 512
TARGET_TOKENS = 8192
WORKER = 0x1234


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def kv_message(seq: int, events: list[dict]) -> bytes:
    payload = msgpack.packb(events, use_bin_type=True)
    env = {
        "publisher_id": 1,
        "sequence": seq,
        "published_at": int(time.time() * 1000),
        "topic": "kv-events",
        "payload": payload,
    }
    return msgpack.packb(env, use_bin_type=True)


def stored_event(event_id: int, ext: list[int], local: list[int], parent: int | None) -> dict:
    blocks = [{"block_hash": e, "tokens_hash": t, "mm_extra_info": None} for e, t in zip(ext, local, strict=True)]
    data = {"stored": {"parent_hash": parent, "start_position": None, "blocks": blocks}}
    return {
        "worker_id": WORKER,
        "storage_tier": "device",
        "residency_domain": "worker",
        "event": {"event_id": event_id, "data": data, "dp_rank": 0},
    }


def removed_event(event_id: int, ext: list[int]) -> dict:
    data = {"removed": {"block_hashes": ext}}
    return {
        "worker_id": WORKER,
        "storage_tier": "device",
        "residency_domain": "worker",
        "event": {"event_id": event_id, "data": data, "dp_rank": 0},
    }


# --- stage -----------------------------------------------------------------------------------------
def discover_resident(discovery: DonorDiscovery, ns: NamespaceKey, tokens: list[int]) -> DiscoveryResult:
    """The router's semantic stage in one thread: spans first, the prompt embedding only when they find nothing."""
    result = discovery.discover("bench", ns, tokens, embed=False)
    if result.spans or result.exact_wins:
        return result
    vector = discovery.embed_prompts([tokens])[0]
    return discovery.discover("bench", ns, tokens, prompt_vector=vector)


def bench_stage(n_donors: int, embedder_name: str, iterations: int) -> dict[str, float]:
    rng = np.random.default_rng(n_donors)
    # The router's default index capacity (100K: usearch HNSW when installed), as a deployment would run it.
    cfg = SemblendConfig(block_size=BLOCK, embedder=embedder_name, min_span_tokens=64)
    cfg.index_capacity = max(n_donors, cfg.index_capacity)
    embedder = build_embedder(cfg)
    discovery = DonorDiscovery.from_config(
        cfg, embedder=embedder, tokenizer=TokenizerAdapter.from_config(None), background=False
    )
    ns = NamespaceKey(model_id=cfg.model_id, tokens_per_block=BLOCK)
    digest = ns.digest()
    residency = Residency(capacity=cfg.index_capacity)
    tree = RadixTree()
    donors = rng.integers(100, 7000, size=(n_donors, DONOR_TOKENS), dtype=np.int64)
    ids = [f"d{i}" for i in range(n_donors)]
    t0 = time.perf_counter()
    for i, donor_id in enumerate(ids):
        # Spans index the donor's tokens; the embedding comes as a replica would get it (registration message).
        discovery.aligner.add_donor(donor_id, digest, donors[i])
        discovery._donors[donor_id] = i
    vectors = rng.standard_normal((n_donors, embedder.dim)).astype(np.float32)
    for start in range(0, n_donors, 10_000):
        discovery.index.insert_batch(ids[start : start + 10_000], digest, vectors[start : start + 10_000])
    for i, donor_id in enumerate(ids):
        local = compute_block_hash_for_seq(donors[i].tolist(), BLOCK)
        ext = [(i << 8) + j for j in range(len(local))]
        residency.apply(
            decode_kv_events(kv_message(i, [stored_event(i + 1, ext, local, None)]), max_bytes=1 << 20).events[0]
        )
        residency.add_donor(
            DonorRegistration(
                donor_id=donor_id,
                worker_id=WORKER,
                deployment="b",
                namespace=digest,
                num_tokens=DONOR_TOKENS,
                block_size=BLOCK,
                block_hashes=local,
                embedding=b"",
                embedding_dim=0,
            )
        )
        tree.apply_event(WORKER, json.dumps(stored_event(i + 1, ext, local, None)["event"]).encode())
    setup_s = time.perf_counter() - t0
    picks = rng.choice(n_donors, size=8, replace=False)
    filler = rng.integers(100, 7000, size=TARGET_TOKENS - 8 * DONOR_TOKENS).tolist()
    target = filler[:2048] + [t for i in picks[::-1] for t in donors[i].tolist()] + filler[2048:]
    assert len(target) == TARGET_TOKENS

    def semantic() -> None:
        result = discover_resident(discovery, ns, target)
        assert result.primary_donor is not None

    unrelated = rng.integers(100, 7000, size=TARGET_TOKENS).tolist()

    def no_spans() -> None:
        result = discover_resident(discovery, ns, unrelated)
        assert result.embedded and not result.spans

    def exact() -> None:
        tree.find_matches(compute_block_hash_for_seq(target, BLOCK))

    out: dict[str, float] = {"setup_s": setup_s}
    for name, fn in (("semantic", semantic), ("no_spans", no_spans), ("exact", exact)):
        fn()
        times = []
        for _ in range(iterations):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = pct(times, 50), pct(times, 99)
    discovery.close()
    return out


# --- ingest ----------------------------------------------------------------------------------------
def ingest_messages(n_messages: int, blocks_per_event: int = 16) -> tuple[list[bytes], int]:
    """Stored events (every 4th followed by a removal of half its blocks); returns messages and block events."""
    rng = random.Random(1)
    messages, blocks, event_id = [], 0, 0
    for m in range(n_messages):
        local = [rng.getrandbits(64) for _ in range(blocks_per_event)]
        ext = [(m << 8) + j for j in range(blocks_per_event)]
        event_id += 1
        events = [stored_event(event_id, ext, local, None)]
        blocks += blocks_per_event
        if m % 4 == 3:
            event_id += 1
            events.append(removed_event(event_id, ext[: blocks_per_event // 2]))
            blocks += blocks_per_event // 2
        messages.append(kv_message(m, events))
    return messages, blocks


def donors_over(residency: Residency, messages: list[bytes], n: int) -> None:
    """Register ``n`` donors whose blocks are among the stored events (residency does real work)."""
    for i, data in enumerate(messages[:n]):
        env = msgpack.unpackb(data)
        stored = msgpack.unpackb(env["payload"])[0]["event"]["data"]["stored"]["blocks"]
        residency.add_donor(
            DonorRegistration(
                donor_id=f"d{i}",
                worker_id=WORKER,
                deployment="b",
                namespace="ns",
                num_tokens=16 * BLOCK,
                block_size=BLOCK,
                block_hashes=[b["tokens_hash"] for b in stored],
                embedding=b"",
                embedding_dim=0,
            )
        )


def bench_ingest(n_messages: int) -> dict[str, float]:
    messages, blocks = ingest_messages(n_messages)
    residency = Residency(capacity=100_000)
    donors_over(residency, messages, min(10_000, n_messages))
    t = time.perf_counter()
    for data in messages:
        for event in decode_kv_events(data, max_bytes=1 << 20).events:
            residency.apply(event)
    router_s = time.perf_counter() - t
    t = time.perf_counter()
    for data in messages:
        msgpack.unpackb(msgpack.unpackb(data)["payload"])
    unpack_s = time.perf_counter() - t
    tree = RadixTree()
    t = time.perf_counter()
    for data in messages:
        for rev in msgpack.unpackb(msgpack.unpackb(data)["payload"]):
            tree.apply_event(rev["worker_id"], json.dumps(rev["event"]).encode())
    radix_s = time.perf_counter() - t
    return {
        "blocks": blocks,
        "router_blocks_per_s": blocks / router_s,
        "unpack_blocks_per_s": blocks / unpack_s,
        "radix_blocks_per_s": blocks / radix_s,
        "resident_after": len(residency.resident("ns")),
    }


async def _consume(url: str, subject: str, expected_messages: int, timeout: float) -> dict[str, float]:
    import nats

    residency = Residency(capacity=100_000)
    lags: list[tuple[float, float]] = []
    blocks = 0
    done = asyncio.Event()

    async def on_msg(msg) -> None:  # type: ignore[no-untyped-def]
        nonlocal blocks
        batch = decode_kv_events(msg.data, max_bytes=1 << 20)
        for event in batch.events:
            residency.apply(event)
            blocks += event.num_blocks
        now = time.time() * 1000
        lags.append((now, now - batch.published_at))
        if len(lags) >= expected_messages:
            done.set()

    nc = await nats.connect(url)
    await nc.subscribe(subject, cb=on_msg, pending_msgs_limit=10_000_000, pending_bytes_limit=1 << 32)
    await nc.flush()
    print("CONSUMER_READY", flush=True)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(done.wait(), timeout)
    await nc.close()
    if not lags:
        return {"received": 0}
    start, end = lags[0][0], lags[-1][0]
    first = [lag for ts, lag in lags if ts - start <= 1000]
    last = [lag for ts, lag in lags if end - ts <= 1000]
    return {
        "received": len(lags),
        "blocks": blocks,
        "achieved_blocks_per_s": blocks / max((end - start) / 1000, 1e-3),
        "lag_first_s_p50_ms": pct(first, 50),
        "lag_first_s_p99_ms": pct(first, 99),
        "lag_last_s_p50_ms": pct(last, 50),
        "lag_last_s_p99_ms": pct(last, 99),
    }


async def _publish(url: str, subject: str, n_messages: int, rate_blocks: float) -> None:
    import nats

    messages, blocks = ingest_messages(n_messages)
    per_msg = blocks / n_messages
    interval = per_msg / rate_blocks
    nc = await nats.connect(url)
    start = time.perf_counter()
    for i, _ in enumerate(messages):
        target = start + i * interval
        delay = target - time.perf_counter()
        if delay > 0.002:
            await asyncio.sleep(delay)
        env = msgpack.unpackb(messages[i])
        env["published_at"] = int(time.time() * 1000)  # stamp at send time, as Dynamo does
        await nc.publish(subject, msgpack.packb(env, use_bin_type=True))
    await nc.flush()
    await nc.close()


def bench_ingest_nats(rate_blocks: float, seconds: float) -> dict[str, float]:
    from tests.support.nats import NatsServer

    n_messages = int(rate_blocks * seconds / 20)  # 20 block events per message on average (16 stored + 4 removed)
    subject = "namespace.bench.component.backend.endpoint.generate.kv-events"
    with NatsServer() as server:
        publisher = subprocess.Popen(
            [sys.executable, __file__, "--publisher", server.url, subject, str(n_messages), str(rate_blocks)],
            stdout=subprocess.DEVNULL,
        )
        result = asyncio.run(_consume_after_start(server.url, subject, n_messages, seconds * 4 + 10, publisher))
        publisher.wait(30)
    result["offered_blocks_per_s"] = rate_blocks
    return result


async def _consume_after_start(
    url: str, subject: str, n: int, timeout: float, publisher: subprocess.Popen
) -> dict[str, float]:
    # The publisher waits 1 s before sending, which is enough for this subscription to be in place.
    return await _consume(url, subject, n, timeout)


# --- e2e -------------------------------------------------------------------------------------------
def bench_e2e(n_donors: int, requests: int) -> dict[str, float]:
    from semblend_dynamo.events.codec import encode
    from semblend_dynamo.events.schemas import deployment_digest
    from semblend_dynamo.namespace import ModelIdentity
    from tests.router.cluster import Cluster, wait_until

    cluster = Cluster()
    try:
        cluster.env.update({"SEMBLEND_BLOCK_SIZE": "16"})
        workers = [
            cluster.start_worker("w1", capacity_blocks=1 << 20),
            cluster.start_worker("w2", capacity_blocks=1 << 20),
        ]
        semantic = cluster.start_router("bench-semantic")
        exact = cluster.start_router("bench-exact", enabled="0")
        wait_until(lambda: semantic.health()["status"] == "ok" and exact.health()["status"] == "ok", timeout=30)
        cfg = SemblendConfig(model_id="test-model", block_size=16, embedder="hash")
        ns = ModelIdentity.from_config(cfg).namespace()
        rng = np.random.default_rng(3)
        embedder = build_embedder(cfg)
        messages = []
        donors = rng.integers(100, 7000, size=(n_donors, 256), dtype=np.int64)
        for i in range(n_donors):
            local = compute_block_hash_for_seq(donors[i].tolist(), 16)
            worker_id = workers[i % 2].worker_id
            emb, dim = DonorRegistration.pack_embedding(rng.standard_normal(embedder.dim).astype(np.float32))
            reg = DonorRegistration(
                donor_id=f"bench-{i}",
                router_id="bench",
                worker_id=worker_id,
                deployment=deployment_digest(ns),
                namespace=ns.digest(),
                num_tokens=256,
                block_size=16,
                block_hashes=local,
                embedding=emb,
                embedding_dim=dim,
            )
            # The donor's blocks as its worker would announce them, so that the donor is resident.
            # Consecutive ids per worker: a gap would make Dynamo (and the router) recover from the worker's
            # own indexer, which has never seen these synthetic blocks.
            event = stored_event(i // 2 + 1, [(1 << 40) + (i << 8) + j for j in range(len(local))], local, None)
            event["worker_id"] = worker_id
            messages.append((cluster.subject("kv-events"), kv_message(i, [event])))
            messages.append((cluster.subject("semblend.donors"), encode(reg)))
        cluster.publish_raw(messages)
        wait_until(lambda: semantic.metric("semblend_router_donors", state="resident") >= n_donors, timeout=300)

        def run(router) -> list[float]:  # type: ignore[no-untyped-def]
            # Fresh prompts per router, so neither finds the other's requests as exact prefixes.
            reqs = [
                {
                    "token_ids": rng.integers(100, 7000, size=TARGET_TOKENS).tolist(),
                    "stop_conditions": {"max_tokens": 2},
                }
                for _ in range(requests + 2)
            ]
            results = cluster.send(reqs, instance=router.instance)
            assert all(r["ok"] for r in results), results
            return [r["latency_ms"] for r in results[2:]]  # the first two warm up

        exact_ms = run(exact)
        semantic_ms = run(semantic)
        out: dict[str, float] = {
            "donors": n_donors,
            "exact_router_p50_ms": pct(exact_ms, 50),
            "exact_router_p99_ms": pct(exact_ms, 99),
            "semantic_router_p50_ms": pct(semantic_ms, 50),
            "semantic_router_p99_ms": pct(semantic_ms, 99),
        }
        for router, name in ((semantic, "semantic"), (exact, "exact")):
            for st in ("exact", "semantic", "total_added"):
                count = router.metric("semblend_router_stage_seconds_count", stage=st)
                total = router.metric("semblend_router_stage_seconds_sum", stage=st)
                out[f"{name}_router_{st}_mean_ms"] = total / count * 1e3 if count else 0.0
        return out
    finally:
        cluster.close()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--publisher":
        url, subject, n, rate = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        time.sleep(1.0)
        asyncio.run(_publish(url, subject, n, rate))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--embedder", choices=["hash", "minilm"], default="hash")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--ingest-messages", type=int, default=20_000)
    parser.add_argument("--nats-rates", type=float, nargs="+", default=[100_000, 200_000, 300_000])
    parser.add_argument("--nats-seconds", type=float, default=5.0)
    parser.add_argument("--parts", nargs="+", choices=["stage", "ingest", "nats"], default=["stage", "ingest", "nats"])
    parser.add_argument("--e2e", action="store_true")
    parser.add_argument("--e2e-donors", type=int, default=10_000)
    parser.add_argument("--e2e-requests", type=int, default=30)
    args = parser.parse_args()
    print(
        f"# host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    if "stage" in args.parts:
        bench_stage_table(args)
    if "ingest" in args.parts:
        bench_ingest_table(args)
    if "nats" in args.parts:
        bench_nats_table(args)
    if args.e2e:
        bench_e2e_table(args)


def bench_stage_table(args: argparse.Namespace) -> None:
    print("\n## semantic stage vs exact-only path, 8,192-token prompt (ms)")
    print(
        "| donors | embedder | spans p50 | spans p99 | no spans (embedding) p50 | no spans p99 | exact-only p50 "
        "| exact-only p99 | spans p99 / exact p99 | setup s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.donors:
        r = bench_stage(n, args.embedder, args.iterations)
        print(
            f"| {n:,} | {args.embedder} | {r['semantic_p50_ms']:.3f} | {r['semantic_p99_ms']:.3f} | "
            f"{r['no_spans_p50_ms']:.3f} | {r['no_spans_p99_ms']:.3f} | {r['exact_p50_ms']:.3f} | "
            f"{r['exact_p99_ms']:.3f} | {r['semantic_p99_ms'] / r['exact_p99_ms']:.1f}x | {r['setup_s']:.0f} |",
            flush=True,
        )


def bench_ingest_table(args: argparse.Namespace) -> None:
    print("\n## kv-event ingest in-process (block events/s)")
    r = bench_ingest(args.ingest_messages)
    print(
        "| block events | router decode+residency | msgpack unpack only | Dynamo RadixTree (JSON) | router / RadixTree |"
    )
    print("|---|---|---|---|---|")
    print(
        f"| {r['blocks']:,} | {r['router_blocks_per_s']:,.0f} | {r['unpack_blocks_per_s']:,.0f} | "
        f"{r['radix_blocks_per_s']:,.0f} | {r['router_blocks_per_s'] / r['radix_blocks_per_s']:.1f}x |",
        flush=True,
    )


def bench_nats_table(args: argparse.Namespace) -> None:
    print("\n## kv-event ingest through nats-server (offered rate, separate publisher process)")
    print(
        "| offered blocks/s | achieved blocks/s | lag p50 first s | lag p99 first s | lag p50 last s | lag p99 last s |"
    )
    print("|---|---|---|---|---|---|")
    for rate in args.nats_rates:
        r = bench_ingest_nats(rate, args.nats_seconds)
        print(
            f"| {rate:,.0f} | {r.get('achieved_blocks_per_s', 0):,.0f} | {r.get('lag_first_s_p50_ms', 0):.1f} ms | "
            f"{r.get('lag_first_s_p99_ms', 0):.1f} ms | {r.get('lag_last_s_p50_ms', 0):.1f} ms | {r.get('lag_last_s_p99_ms', 0):.1f} ms |",
            flush=True,
        )


def bench_e2e_table(args: argparse.Namespace) -> None:
    print("\n## end to end through Dynamo (8,192-token requests, client-measured ms, sequential)")
    r = bench_e2e(args.e2e_donors, args.e2e_requests)
    print(
        "| donors | exact-only router p50 | p99 | semantic router p50 | p99 | semantic router mean stage ms: exact / semantic / total added | exact-only router total added |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {r['donors']:,.0f} | {r['exact_router_p50_ms']:.1f} | {r['exact_router_p99_ms']:.1f} | "
        f"{r['semantic_router_p50_ms']:.1f} | {r['semantic_router_p99_ms']:.1f} | "
        f"{r['semantic_router_exact_mean_ms']:.2f} / {r['semantic_router_semantic_mean_ms']:.2f} / "
        f"{r['semantic_router_total_added_mean_ms']:.2f} | {r['exact_router_total_added_mean_ms']:.2f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
