"""A connector test worker: a Dynamo worker endpoint that runs every request through the SemBlend connector in its
PyExecutor harness (:mod:`trtllm_connector.harness`, context-dependent stand-in model), standing in for a
``dynamo.trtllm`` worker with the connector where TensorRT-LLM cannot run.

It registers the model's card on ``<namespace>.<component>.<endpoint>`` beside the ``dynamo.mocker`` workers,
publishes the KV blocks of what it served through Dynamo's own ``KvEventPublisher`` (on the runtime's event
plane, so the router sees residency as it sees a mocker's), and prefills each request's token ids through the
harness. The connector is configured from the ``SEMBLEND_*`` environment like a real worker's, with
``worker_id`` = this endpoint's Dynamo instance id and ``connector_nats`` on: the router's hints reach it on its
NATS hint subject, the only way a hint reaches a connector in a Dynamo deployment. Its audit records go to
``SEMBLEND_AUDIT_PATH`` (JSON lines; with ``SEMBLEND_AUDIT_APPEND=1`` that exact file).

Run as a subprocess (``python -m tests.support.dynamo_connector_test_worker --help``); it prints
``READY <worker_id>`` once serving and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from typing import Any

from dynamo.llm import KvEventPublisher, ModelInput, ModelRuntimeConfig, ModelType, WorkerType, register_model
from dynamo.runtime import DistributedRuntime

from semblend_dynamo.audit import AuditWriter, audit_file
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.tokenizer import TokenizerAdapter
from tests.support.dynamo_test_worker import TestWorkerCache
from trtllm_connector.harness import PyExecutorHarness

STAND_IN_MODEL_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "hidden_size": 32,
    "head_dim": 16,
    "rope_theta": 10000.0,
}
"""The stand-in model's geometry and RoPE; ``SEMBLEND_ROPE_CONFIG`` of the router and this worker (the namespace
key carries its RoPE fingerprint, so both must be given the same)."""


def build_harness(cfg: SemblendConfig, num_blocks: int) -> PyExecutorHarness:
    """The connector (scheduler + worker) over a KV pool of the stand-in model's geometry."""
    return PyExecutorHarness.with_stand_in(
        cfg,
        num_layers=STAND_IN_MODEL_CONFIG["num_hidden_layers"],
        num_kv_heads=STAND_IN_MODEL_CONFIG["num_key_value_heads"],
        head_dim=STAND_IN_MODEL_CONFIG["head_dim"],
        rope_theta=STAND_IN_MODEL_CONFIG["rope_theta"],
        num_blocks=num_blocks,
        prefix_reuse=cfg.isolation != "no_block_reuse",
        audit=AuditWriter(audit_file(cfg)),
    )


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    drt = DistributedRuntime(
        loop, os.environ.get("DYN_DISCOVERY_BACKEND", "file"), "tcp", event_plane=os.environ.get("DYN_EVENT_PLANE")
    )
    ep = drt.endpoint(f"{args.namespace}.{args.component}.{args.endpoint}")
    worker_id = ep.connection_id()
    cfg = SemblendConfig.load().model_copy(update={"worker_id": worker_id, "connector_nats": True})
    harness = build_harness(cfg, args.pool_blocks)
    rc = ModelRuntimeConfig()
    rc.total_kv_blocks = args.capacity_blocks
    rc.max_num_seqs = 64
    rc.max_num_batched_tokens = 65536
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        ep,
        args.model_path,
        args.model,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=cfg.block_size,
        runtime_config=rc,
    )
    publisher = KvEventPublisher(ep, kv_block_size=cfg.block_size, enable_local_indexer=True)
    cache = TestWorkerCache(publisher, cfg.block_size, args.capacity_blocks)
    engine = asyncio.Lock()  # the harness runs one request per iteration, like one PyExecutor loop

    async def generate(request: dict[str, Any], context: Any = None) -> Any:
        tokens = list(request["token_ids"])
        async with engine:
            await asyncio.to_thread(harness.run_request, tokens, capture_kv=False)
        cache.store(tokens)
        yield {"token_ids": [7], "finish_reason": None}
        yield {"token_ids": [8], "finish_reason": "stop"}

    if args.serve_first:  # e.g. a system prompt: its blocks are resident here, so Dynamo steers its followers here
        tokens = TokenizerAdapter.from_file(os.path.join(args.model_path, "tokenizer.json")).encode(args.serve_first)
        await asyncio.to_thread(harness.run_request, tokens, capture_kv=False)
        cache.store(tokens)
    serving = asyncio.ensure_future(ep.serve_endpoint(generate))
    link = harness.scheduler.link
    if link is not None:
        await asyncio.to_thread(link.connected.wait, 30)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY {worker_id} {json.dumps({'hints_subscribed': bool(link and link.connected.is_set())})}", flush=True)
    await stop.wait()
    serving.cancel()
    if link is not None:
        link.close()
    harness.scheduler.audit.close()
    publisher.shutdown()
    drt.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--namespace", required=True)
    p.add_argument("--component", default="backend")
    p.add_argument("--endpoint", default="generate")
    p.add_argument("--model", required=True, help="served model name (the mockers' card)")
    p.add_argument("--model-path", required=True, help="model directory whose tokenizer the card carries")
    p.add_argument("--capacity-blocks", type=int, default=4096, help="blocks of the published (device) KV cache")
    p.add_argument("--pool-blocks", type=int, default=4096, help="blocks of the harness's KV pool")
    p.add_argument("--serve-first", default="", help="a prompt (text) to serve before reporting ready")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
