"""``semblend-dynamo router`` / ``python -m semblend_dynamo.router``: the router as a Dynamo component.

Serves ``<dynamo_namespace>.<router_component>.generate`` and forwards to
``<dynamo_namespace>.<worker_component>.<worker_endpoint>`` through Dynamo's ``KvRouter``. Dynamo itself is
configured by its usual environment (``DYN_DISCOVERY_BACKEND``, ``DYN_FILE_KV``, ``DYN_REQUEST_PLANE``,
``DYN_TCP_RPC_HOST`` ...); ``NATS_SERVER`` defaults to ``SEMBLEND_NATS_URL``. See docs/router.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from ..config import ConfigError, SemblendConfig, add_config_arguments, config_from_args
from ..embedder import build_embedder
from ..events.link import NatsLink
from ..events.publisher import EvidencePublisher
from ..events.schemas import DonorLifecycle, DonorRegistration, OutcomeReport, deployment_digest
from ..events.subscriber import EventSubscriber
from ..namespace import ModelIdentity, tenant_of
from ..pipeline import DonorDiscovery
from ..tokenizer import TokenizerAdapter
from .health import HealthServer, HealthStatus
from .metrics import RouterMetrics
from .residency import Residency

log = logging.getLogger("semblend_dynamo.router")

WORKER_POLL_S = 0.5
RESYNC_DELAY_S = 2.0
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SETTINGS = ("modes", "model", "embedding", "donor index", "planner gates", "prefill chain", "NATS", "Dynamo router")
"""The setting groups the router reads."""
EXAMPLES = """examples:
  semblend-dynamo router --model-id Qwen/Qwen3-8B --model-path Qwen/Qwen3-8B --nats-url nats://nats:4222
  semblend-dynamo router --config semblend.yaml --metrics-port 9090
  SEMBLEND_DISCOVERY_ONLY=1 semblend-dynamo router     # find donors and report, never promise reuse
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("SEMBLEND_LOG_LEVEL", "INFO").upper(),
        help="Python log level (SEMBLEND_LOG_LEVEL)",
    )
    add_config_arguments(parser, SETTINGS)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.log_level not in LOG_LEVELS:  # a bad SEMBLEND_LOG_LEVEL default is not checked by argparse
        raise ConfigError(f"SEMBLEND_LOG_LEVEL={args.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=args.log_level,
        format='{"ts":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}',
    )
    return asyncio.run(serve(cfg))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m semblend_dynamo.router", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as exc:
        print(f"semblend router: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def nats_reachable(url: str, timeout: float = 1.0) -> bool:
    """A TCP connect to the NATS URL's host and port (Dynamo's runtime blocks for minutes without NATS)."""
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 4222), timeout):
            return True
    except OSError:
        return False


def build_discovery(cfg: SemblendConfig) -> DonorDiscovery | None:
    """The core pipeline as the router uses it (None when semantic search is disabled)."""
    if not cfg.enabled:
        return None
    embedder = build_embedder(cfg)
    return DonorDiscovery.from_config(cfg, embedder=embedder, tokenizer=TokenizerAdapter.from_config(cfg.tokenizer))


async def register_router_model(cfg: SemblendConfig, endpoint: Any) -> None:
    """Publish a model card (token input, chat + completions) for the router's endpoint.

    A Dynamo Frontend serves the model cards it discovers in its namespace, so this is what puts the router in
    the request path. Without ``model_path`` the card carries no tokenizer or chat template (tests, or clients
    that send token ids on Dynamo's request plane).
    """
    from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        endpoint,
        cfg.model_path or cfg.model_id,
        cfg.model_id,
        worker_type=WorkerType.Aggregated,
        kv_cache_block_size=cfg.block_size,
        skip_model_assets=cfg.model_path is None,
    )


async def serve(cfg: SemblendConfig, *, stop: asyncio.Event | None = None) -> int:
    """Run the router until SIGTERM/SIGINT (or ``stop``). Returns the process exit code."""
    from dynamo.llm import KvRouter, KvRouterConfig
    from dynamo.runtime import DistributedRuntime

    from .handler import SemanticRouter

    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    router_id = uuid.uuid4().hex
    metrics = RouterMetrics()
    link = NatsLink(cfg, name=f"semblend-router-{router_id[:8]}")
    os.environ.setdefault("NATS_SERVER", cfg.nats_url)
    event_plane = "nats" if nats_reachable(os.environ["NATS_SERVER"]) else "zmq"
    residency = Residency(cfg.index_capacity)
    serving = False

    def health() -> HealthStatus:
        reasons = []
        if not link.connected:
            reasons.append("nats_disconnected: routing exact-only, evidence queued")
        if event_plane != "nats":
            reasons.append("started without NATS: Dynamo KV events unavailable until restart")
        metrics.nats_connected.set(1 if link.connected else 0)
        status = "stopped" if not serving else ("degraded" if reasons else "ok")
        return HealthStatus(
            status=status,
            serving=serving,
            nats_connected=link.connected,
            event_plane=event_plane,
            reasons=reasons,
            donors=len(residency),
            workers=len(residency.workers()),
        )

    router: SemanticRouter | None = None

    def exposition() -> bytes:
        if router is not None:
            router.refresh_gauges()
        return metrics.exposition()

    http: HealthServer | None = None
    if cfg.metrics_port:
        http = HealthServer(
            cfg.metrics_host, cfg.metrics_port, health=health, metrics=exposition, donors=residency.snapshot
        )
        await http.start()
    if event_plane != "nats":
        log.warning(
            "NATS %s unreachable at start: Dynamo runtime uses the zmq event plane; routing exact-only", cfg.nats_url
        )

    identity = ModelIdentity.from_config(cfg)
    deployment = deployment_digest(identity.namespace())
    drt = DistributedRuntime(loop, os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"), "tcp", event_plane=event_plane)
    worker_ep = drt.endpoint(f"{cfg.dynamo_namespace}.{cfg.worker_component}.{cfg.worker_endpoint}")
    kv_router = KvRouter(worker_ep, cfg.block_size, KvRouterConfig())
    discovery = build_discovery(cfg)
    publisher = EvidencePublisher(
        link,
        queue_size=cfg.evidence_queue_size,
        on_sent=lambda kind: metrics.events_out.labels(kind).inc(),
        on_dropped=lambda kind, reason: metrics.events_dropped.labels(kind, reason).inc(),
    )
    router = SemanticRouter(
        cfg,
        kv_router=kv_router,
        discovery=discovery,
        residency=residency,
        link=link,
        publisher=publisher,
        metrics=metrics,
        namespace_of=lambda lora, salt: identity.namespace(lora=lora, tenant=tenant_of(salt)),
        deployment=deployment,
        router_id=router_id,
    )
    subscriber = EventSubscriber(
        link,
        max_bytes=cfg.max_message_bytes,
        deployment=deployment,
        on_received=lambda stream: metrics.events_in.labels(stream).inc(),
        on_rejected=lambda stream, reason: metrics.events_rejected.labels(stream, reason).inc(),
    )
    subjects = router.subjects
    subscriber.kv_events(subjects.kv_events, router.on_kv_events)
    subscriber.semblend(subjects.donors, (DonorRegistration, DonorLifecycle), router.on_donor_event, stream="donors")
    subscriber.semblend(router.sync_inbox, (DonorRegistration,), router.on_donor_event, stream="donors")
    subscriber.semblend(subjects.outcomes, (OutcomeReport,), router.on_outcome, stream="outcomes")
    link.subscribe(subjects.donors_sync, router.on_sync_request)

    async def on_connect() -> None:
        await router.request_sync()
        if event_plane == "nats":
            await asyncio.sleep(RESYNC_DELAY_S)  # let Dynamo's KvRouter recover from the workers' local indexers
            await router.resync_blocks()

    link.on_reconnect.append(on_connect)
    link.start()
    publisher.start()

    router_namespace = cfg.router_namespace or cfg.dynamo_namespace
    router_ep = drt.endpoint(f"{router_namespace}.{cfg.router_component}.generate")
    serving_future = asyncio.ensure_future(router_ep.serve_endpoint(router.generate))
    if cfg.register_model:
        await register_router_model(cfg, router_ep)
    worker_client = await worker_ep.client()

    async def watch_workers() -> None:
        while True:
            router.retain_workers(worker_client.instance_ids())
            await asyncio.sleep(WORKER_POLL_S)

    watcher = asyncio.ensure_future(watch_workers())
    serving = True
    log.info(
        "router %s serving %s.%s.generate -> %s.%s.%s (event plane %s, metrics port %s)",
        router_id[:8],
        router_namespace,
        cfg.router_component,
        cfg.dynamo_namespace,
        cfg.worker_component,
        cfg.worker_endpoint,
        event_plane,
        http.port if http else "off",
    )
    print(f"SEMBLEND_ROUTER_READY {router_ep.connection_id()} {http.port if http else 0}", flush=True)
    await stop.wait()
    serving = False
    watcher.cancel()
    await publisher.flush(timeout=2.0)
    await router.drain_registrations(timeout=2.0)
    serving_future.cancel()
    await publisher.close()
    await link.close()
    if discovery is not None:
        discovery.close()
    if http is not None:
        await http.close()
    drt.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
