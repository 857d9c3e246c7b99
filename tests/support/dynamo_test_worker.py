"""A test worker: a small Dynamo endpoint standing in for a TensorRT-LLM worker in router tests.

It registers a minimal model card (``skip_model_assets=True``), serves ``generate``, keeps an LRU cache
of the full KV blocks of what it served and publishes real Dynamo KV events with ``KvEventPublisher``
(stored on serve, removed on LRU eviction or on a test command), and appends every request it receives, and every
router hint arriving on its NATS hint subject, to a JSON-lines file. Engine block ids are chained over the prefix like a
prefix-caching engine's, so a shared prefix shares blocks.

Run as a subprocess (``python -m tests.support.dynamo_test_worker --help``); it prints ``READY <worker_id>``
once serving. Test commands arrive as NATS requests on ``semblend_test.<name>.control`` (JSON):
``{"cmd": "info"}``, ``{"cmd": "store", "tokens": [...], "cache_salt": "", "lora": ""}``,
``{"cmd": "evict", "tokens": [...], ...}``, ``{"cmd": "evict_all"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from collections import OrderedDict
from typing import Any

import nats
import xxhash
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

from semblend_dynamo.events.codec import RejectedMessage, decode
from semblend_dynamo.events.schemas import DonorHint
from semblend_dynamo.events.subjects import Subjects


def _i64(u: int) -> int:
    return u - (1 << 64) if u >= (1 << 63) else u


def control_subject(name: str) -> str:
    return f"semblend_test.{name}.control"


class TestWorkerCache:
    """LRU of engine blocks; publishes stored/removed through a KvEventPublisher."""

    def __init__(self, publisher: KvEventPublisher, block_size: int, capacity_blocks: int) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, int] = OrderedDict()  # engine id (i64) -> parent engine id

    def engine_ids(self, tokens: list[int], cache_salt: str, lora: str) -> list[int]:
        local = compute_block_hash_for_seq(
            tokens, self.block_size, lora_name=lora or None, cache_namespace=cache_salt or None
        )
        ids, parent = [], 0
        for h in local:
            parent = _i64(xxhash.xxh3_64_intdigest(parent.to_bytes(8, "little", signed=True) + h.to_bytes(8, "little")))
            ids.append(parent)
        return ids

    def store(self, tokens: list[int], cache_salt: str = "", lora: str = "") -> int:
        ids = self.engine_ids(tokens, cache_salt, lora)
        first_new = next((i for i, e in enumerate(ids) if e not in self.blocks), len(ids))
        for e in ids[:first_new]:
            self.blocks.move_to_end(e)
        new = ids[first_new:]
        if new:
            parent = ids[first_new - 1] if first_new else None
            start = first_new * self.block_size
            self.publisher.publish_stored(
                token_ids=tokens[start : start + len(new) * self.block_size],
                num_block_tokens=[self.block_size] * len(new),
                block_hashes=new,
                parent_hash=parent,
                lora_name=lora or None,
                cache_salt=cache_salt or None,
            )
            for i, e in enumerate(new):
                self.blocks[e] = ids[first_new + i - 1] if first_new + i else 0
        self._evict_over_capacity()
        return len(new)

    def _evict_over_capacity(self) -> None:
        victims = []
        while len(self.blocks) > self.capacity:
            victims.append(self.blocks.popitem(last=False)[0])
        if victims:
            self.publisher.publish_removed(block_hashes=victims)

    def evict(self, ids: list[int]) -> int:
        victims = [e for e in ids if self.blocks.pop(e, None) is not None]
        if victims:
            self.publisher.publish_removed(block_hashes=victims)
        return len(victims)


def _salt_and_lora(request: dict[str, Any]) -> tuple[str, str]:
    routing = request.get("routing") or {}
    extra = request.get("extra_args") or {}
    salt = routing.get("cache_namespace") or (extra.get("nvext") or {}).get("cache_salt") or ""
    return str(salt), str(routing.get("lora_name") or "")


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    drt = DistributedRuntime(loop, os.environ.get("DYN_DISCOVERY_BACKEND", "file"), "tcp", event_plane="nats")
    ep = drt.endpoint(f"{args.namespace}.{args.component}.{args.endpoint}")
    rc = ModelRuntimeConfig()
    rc.total_kv_blocks = args.capacity_blocks
    rc.max_num_seqs = 64
    rc.max_num_batched_tokens = 65536
    await register_model(
        ModelInput.Tokens,
        ModelType.Completions,
        ep,
        args.model,
        args.model,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=args.block_size,
        runtime_config=rc,
        skip_model_assets=True,
    )
    publisher = KvEventPublisher(ep, kv_block_size=args.block_size, enable_local_indexer=True)
    cache = TestWorkerCache(publisher, args.block_size, args.capacity_blocks)
    worker_id = ep.connection_id()

    async def generate(request: dict[str, Any], context: Any = None) -> Any:
        with open(args.record, "a") as f:
            f.write(json.dumps({"worker_id": worker_id, "request": request}, default=repr) + "\n")
        salt, lora = _salt_and_lora(request)
        cache.store(list(request["token_ids"]), salt, lora)
        await asyncio.sleep(args.delay_s)
        yield {"token_ids": [7], "finish_reason": None}
        yield {"token_ids": [8], "finish_reason": "stop"}

    serving = asyncio.ensure_future(ep.serve_endpoint(generate))

    nc = await nats.connect(os.environ["NATS_SERVER"], max_reconnect_attempts=-1, reconnect_time_wait=0.3)

    async def control(msg: Any) -> None:
        cmd = json.loads(msg.data)
        tokens = list(cmd.get("tokens", []))
        salt, lora = cmd.get("cache_salt", ""), cmd.get("lora", "")
        if cmd["cmd"] == "store":
            result: dict[str, Any] = {"stored": cache.store(tokens, salt, lora)}
        elif cmd["cmd"] == "evict":
            result = {"evicted": cache.evict(cache.engine_ids(tokens, salt, lora))}
        elif cmd["cmd"] == "evict_all":
            result = {"evicted": cache.evict(list(cache.blocks))}
        else:
            result = {}
        result["worker_id"] = worker_id
        await msg.respond(json.dumps(result).encode())

    async def hint(msg: Any) -> None:
        try:
            received = decode(msg.data, DonorHint, max_bytes=1 << 20).model_dump(mode="json", by_alias=True)
        except RejectedMessage as exc:
            received = {"rejected": exc.reason}
        with open(args.record, "a") as f:
            f.write(json.dumps({"worker_id": worker_id, "hint": received}) + "\n")

    await nc.subscribe(control_subject(args.name), cb=control)
    await nc.subscribe(Subjects.for_endpoint(args.namespace, args.component, args.endpoint).hints(worker_id), cb=hint)
    await nc.flush()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {worker_id}", flush=True)
    await stop.wait()
    serving.cancel()
    await nc.close()
    publisher.shutdown()
    drt.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--name", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--component", default="backend")
    p.add_argument("--endpoint", default="generate")
    p.add_argument("--model", default="test-model")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--capacity-blocks", type=int, default=4096)
    p.add_argument("--record", required=True, help="JSON-lines file receiving every request")
    p.add_argument("--delay-s", type=float, default=0.0, help="per-request service time")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
