"""Cost of one read of Dynamo's KV index (the router's zmq event-plane path) next to the NATS path's live ingest.

Run: ``.venv/bin/python benchmarks/bench_kv_index_read.py [--workers 8] [--blocks 10000,100000]``

On the zmq event plane the router reads Dynamo's own index every ``SEMBLEND_KV_INDEX_POLL_S`` and reconciles its
residency with it (``semblend_dynamo/router/kv_ingest.py``). The index is Dynamo's ``RadixTree`` (the structure
behind ``KvRouter.dump_events()``), filled with ``--blocks`` blocks per worker in chained 64-block stored events. A
read = dump (``dump_tree_as_events``) + parse (``kv_events_from_dump``) + ``Residency.reconcile`` of an unchanged
index. The baseline, measured in the same run, is the NATS path ingesting the same blocks once as live
``kv-events`` messages (``decode_kv_events`` + ``Residency.apply``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import msgpack
from dynamo.llm import RadixTree

from semblend_dynamo.events.codec import decode_kv_events, kv_events_from_dump
from semblend_dynamo.router.residency import Residency

EVENT_BLOCKS = 64


def stored_events(worker: int, blocks: int, rng: random.Random) -> list[dict]:
    events, parent = [], None
    for event_id, start in enumerate(range(0, blocks, EVENT_BLOCKS), start=1):
        chunk = [
            {"block_hash": rng.getrandbits(63), "tokens_hash": rng.getrandbits(63), "mm_extra_info": None}
            for _ in range(min(EVENT_BLOCKS, blocks - start))
        ]
        events.append(
            {"event_id": event_id, "data": {"stored": {"parent_hash": parent, "blocks": chunk}}, "dp_rank": 0}
        )
        parent = chunk[-1]["block_hash"]
    return events


def dump(tree: RadixTree) -> str:
    """The JSON array ``KvRouter.dump_events()`` returns (``dump_tree_as_events`` gives its elements)."""
    return "[" + ",".join(tree.dump_tree_as_events()) + "]"


def nats_message(worker: int, event: dict, sequence: int) -> bytes:
    payload = msgpack.packb([{"worker_id": worker, "storage_tier": "device", "event": event}])
    envelope = {"publisher_id": worker, "sequence": sequence, "published_at": 0, "topic": "kv-events"}
    return msgpack.packb(envelope | {"payload": payload})


def run(workers: int, blocks: int, repeats: int) -> None:
    rng = random.Random(blocks)
    tree = RadixTree()
    messages = []
    for worker in range(1, workers + 1):
        for i, event in enumerate(stored_events(worker, blocks, rng)):
            tree.apply_event(worker, json.dumps(event).encode())
            messages.append(nats_message(worker, event, i))
    total = workers * blocks

    t0 = time.perf_counter()
    live = Residency(capacity=1000)
    for data in messages:
        for event in decode_kv_events(data, max_bytes=1 << 30).events:
            live.apply(event)
    baseline_s = time.perf_counter() - t0

    residency = Residency(capacity=1000)
    residency.reconcile(kv_events_from_dump(dump(tree)))
    dump_s = parse_s = reconcile_s = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        text = dump(tree)
        t1 = time.perf_counter()
        events = kv_events_from_dump(text)
        t2 = time.perf_counter()
        residency.reconcile(events)
        t3 = time.perf_counter()
        dump_s, parse_s, reconcile_s = dump_s + t1 - t0, parse_s + t2 - t1, reconcile_s + t3 - t2
    read_ms = (dump_s + parse_s + reconcile_s) / repeats * 1e3
    print(
        f"{workers} workers x {blocks} blocks ({total} blocks): one index read {read_ms:.1f} ms "
        f"(dump {dump_s / repeats * 1e3:.1f}, parse {parse_s / repeats * 1e3:.1f}, "
        f"reconcile {reconcile_s / repeats * 1e3:.1f}); baseline NATS live ingest of the same blocks once "
        f"{baseline_s * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--blocks", default="1000,10000,50000", help="blocks per worker, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"host: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    for blocks in (int(b) for b in args.blocks.split(",")):
        run(args.workers, blocks, args.repeats)


if __name__ == "__main__":
    main()
