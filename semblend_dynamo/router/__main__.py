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
import json
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import uvloop

from ..config import ConfigError, SemblendConfig, add_config_arguments, config_from_args
from ..embedder import build_embedder
from ..events.link import NatsLink
from ..events.publisher import EvidencePublisher
from ..events.schemas import deployment_digest
from ..events.subscriber import EventSubscriber
from ..namespace import ModelIdentity, tenant_of
from ..pipeline import DonorDiscovery
from ..tokenizer import TokenizerAdapter
from .catalog import DonorCatalog
from .health import HealthServer, HealthStatus
from .heap import bound_heap_tops
from .kv_ingest import KvIndexFollower, configured_event_plane
from .metrics import RouterMetrics
from .preflight import StartupError, check_discovery, tcp_reachable

if TYPE_CHECKING:
    from .handler import SemanticRouter

log = logging.getLogger("semblend_dynamo.router")

WORKER_POLL_S = 0.5
RESYNC_DELAY_S = 2.0
SHUTDOWN_BUDGET_S = 1.0
"""Seconds a stopping router gives pending donor registrations and evidence (then it closes)."""
T = TypeVar("T")
ReadyHook = Callable[["SemanticRouter", list[int]], Awaitable[None]]
"""Awaited by :func:`serve` once the router's endpoint serves: the router and the live worker ids."""
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


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` (and ``exc`` with a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": self.formatTime(record), "level": record.levelname, "logger": record.name}
        line["msg"] = record.getMessage()
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_logging(level: str, log_format: str) -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO), handlers=[handler], force=True)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.log_level not in LOG_LEVELS:  # a bad SEMBLEND_LOG_LEVEL default is not checked by argparse
        raise ConfigError(f"SEMBLEND_LOG_LEVEL={args.log_level!r}: expected one of {', '.join(LOG_LEVELS)}")
    configure_logging(args.log_level, cfg.log_format)
    configured_event_plane(os.environ)
    check_discovery(os.environ)
    return uvloop.run(serve(cfg))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m semblend_dynamo.router", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except StartupError as exc:
        print(f"semblend router: cannot start: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"semblend router: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


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


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking start-up step off the event loop, in a daemon thread: SIGTERM need not wait for it."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:
            future.get_loop().call_soon_threadsafe(_settle, future, None, exc)
        else:
            future.get_loop().call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=target, name=f"semblend-start-{getattr(fn, '__name__', 'step')}", daemon=True).start()
    return await future


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


async def serve(cfg: SemblendConfig, *, stop: asyncio.Event | None = None, ready: ReadyHook | None = None) -> int:
    """Run the router until SIGTERM/SIGINT (or ``stop``). Returns the process exit code.

    A signal during start-up abandons it at once (blocking steps run in daemon threads) and releases what was
    already set up; a signal while serving drains for at most ``SHUTDOWN_BUDGET_S``. ``ready``, if given, is
    awaited once the endpoint serves, with the router and the live worker ids, before the ready line is printed
    (benchmarks use it to load donor state).
    """
    loop = asyncio.get_running_loop()
    # Donors are hashed and indexed on background threads: whenever one holds the GIL, a request on the loop waits
    # up to the switch interval for it (docs/router.md, "Threads").
    sys.setswitchinterval(cfg.gil_switch_interval_ms / 1000)
    bound_heap_tops(cfg.heap_top_mib << 20)  # freed memory goes back to the OS (docs/router.md, "The heap")
    stop = stop or asyncio.Event()
    main_task = asyncio.current_task()
    state = {"serving": False}

    def on_signal() -> None:
        stop.set()
        if not state["serving"] and main_task is not None:
            main_task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal)
    try:
        async with contextlib.AsyncExitStack() as resources:
            return await _serve(cfg, stop, state, resources, ready)
    except asyncio.CancelledError:
        if not stop.is_set():
            raise
        log.info("stopped during start-up")
        return 0


async def _serve(
    cfg: SemblendConfig,
    stop: asyncio.Event,
    state: dict[str, bool],
    resources: contextlib.AsyncExitStack,
    ready: ReadyHook | None,
) -> int:
    from dynamo.llm import KvRouter, KvRouterConfig
    from dynamo.runtime import DistributedRuntime

    from .handler import SemanticRouter

    loop = asyncio.get_running_loop()
    router_id = uuid.uuid4().hex
    metrics = RouterMetrics()
    link = NatsLink(cfg, name=f"semblend-router-{router_id[:8]}")
    os.environ.setdefault("NATS_SERVER", cfg.nats_url)
    configured_plane = configured_event_plane(os.environ)
    event_plane = configured_plane
    log.info(
        "router starting (event plane %s, discovery %s)", configured_plane, os.environ.get("DYN_DISCOVERY_BACKEND")
    )
    if configured_plane == "nats" and not await in_thread(tcp_reachable, os.environ["NATS_SERVER"], 4222):
        event_plane = "zmq"  # Dynamo's runtime would block for minutes waiting for NATS
    catalog: DonorCatalog | None = None  # built with the pipeline, after the health port is up

    def health() -> HealthStatus:
        reasons = []
        if not link.connected:
            reasons.append("nats_disconnected: routing exact-only, evidence queued")
        if event_plane != configured_plane:
            reasons.append("started without NATS: Dynamo KV events unavailable until restart")
        metrics.nats_connected.set(1 if link.connected else 0)
        serving = state["serving"]
        status = "stopped" if not serving else ("degraded" if reasons else "ok")
        return HealthStatus(
            status=status,
            serving=serving,
            nats_connected=link.connected,
            event_plane=event_plane,
            reasons=reasons,
            donors=len(catalog) if catalog is not None else 0,
            workers=len(catalog.workers()) if catalog is not None else 0,
        )

    router: SemanticRouter | None = None

    def exposition() -> bytes:
        if router is not None:
            router.refresh_gauges()
        return metrics.exposition()

    http: HealthServer | None = None
    if cfg.metrics_port:
        http = HealthServer(
            cfg.metrics_host,
            cfg.metrics_port,
            health=health,
            metrics=exposition,
            donors=lambda: catalog.snapshot() if catalog is not None else [],
        )
        await http.start()
        resources.push_async_callback(http.close)
    if event_plane != configured_plane:
        log.warning(
            "NATS_SERVER=%s unreachable at start (DYN_EVENT_PLANE=nats): Dynamo runtime uses the zmq event plane; "
            "routing exact-only",
            os.environ["NATS_SERVER"],
        )

    identity = await in_thread(ModelIdentity.from_config, cfg)
    deployment = deployment_digest(identity.namespace())
    discovery = await in_thread(build_discovery, cfg)
    if discovery is not None:
        resources.callback(discovery.close)
    catalog = DonorCatalog(cfg.index_capacity, discovery, index_dtype=cfg.index_dtype)
    drt = DistributedRuntime(loop, os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"), "tcp", event_plane=event_plane)
    resources.callback(drt.shutdown)
    worker_ep = drt.endpoint(f"{cfg.dynamo_namespace}.{cfg.worker_component}.{cfg.worker_endpoint}")
    kv_router = KvRouter(worker_ep, cfg.block_size, KvRouterConfig())
    publisher = EvidencePublisher(
        link,
        queue_size=cfg.evidence_queue_size,
        on_sent=metrics.event_out,
        on_dropped=lambda kind, reason: metrics.events_dropped.labels(kind, reason).inc(),
    )
    router = SemanticRouter(
        cfg,
        kv_router=kv_router,
        discovery=discovery,
        catalog=catalog,
        link=link,
        publisher=publisher,
        metrics=metrics,
        namespace_of=lambda lora, salt: identity.namespace(lora=lora, tenant=tenant_of(salt)),
        deployment=deployment,
        router_id=router_id,
    )
    resources.callback(router.close)
    subscriber = EventSubscriber(
        link,
        max_bytes=cfg.max_message_bytes,
        deployment=deployment,
        on_received=lambda stream: metrics.events_in.labels(stream).inc(),
        on_rejected=lambda stream, reason: metrics.events_rejected.labels(stream, reason).inc(),
    )
    if router.embeddings is not None:
        resources.callback(router.embeddings.close)
    router.subscribe(subscriber, kv_events=event_plane == "nats")
    index_follower: KvIndexFollower | None = None
    if configured_plane == "zmq":
        index_follower = KvIndexFollower(
            kv_router,
            router.on_kv_index,
            interval_s=cfg.kv_index_poll_s,
            on_error=lambda reason: metrics.events_rejected.labels("kv_index", reason).inc(),
        )

    async def on_connect() -> None:
        await router.request_sync()
        if event_plane == "nats":
            await asyncio.sleep(RESYNC_DELAY_S)  # let Dynamo's KvRouter recover from the workers' local indexers
            await router.resync_blocks()

    link.on_reconnect.append(on_connect)
    link.start()
    resources.push_async_callback(link.close)
    publisher.start()
    resources.push_async_callback(publisher.close)
    if index_follower is not None:
        index_follower.start()
        resources.push_async_callback(index_follower.close)

    router_namespace = cfg.router_namespace or cfg.dynamo_namespace
    router_ep = drt.endpoint(f"{router_namespace}.{cfg.router_component}.generate")
    serving_future = asyncio.ensure_future(router_ep.serve_endpoint(router.generate))
    resources.callback(serving_future.cancel)
    if cfg.register_model:
        await register_router_model(cfg, router_ep)
    worker_client = await worker_ep.client()

    async def watch_workers() -> None:
        while True:
            router.retain_workers(worker_client.instance_ids())
            await asyncio.sleep(WORKER_POLL_S)

    watcher = asyncio.ensure_future(watch_workers())
    resources.callback(watcher.cancel)
    if ready is not None:
        await ready(router, list(worker_client.instance_ids()))
    state["serving"] = True
    if stop.is_set():  # a signal raced the last start-up step
        return 0
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
    state["serving"] = False
    await router.drain_registrations(timeout=SHUTDOWN_BUDGET_S / 2)
    await publisher.flush(timeout=SHUTDOWN_BUDGET_S / 2)
    return 0  # the resources close in reverse order of creation


if __name__ == "__main__":
    sys.exit(main())
