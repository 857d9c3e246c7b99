"""The router wired as ``semblend_dynamo.router.__main__`` wires it, in-process, on a real nats-server.

Only Dynamo's KvRouter is a test double (``KvRouterTestDouble``: overlap/load tables, records forwards); the
handler, catalog, pipeline, codec, subscriber, publisher and NATS link are the real ones.
"""

from __future__ import annotations

import asyncio
from typing import Any

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.link import NatsLink
from semblend_dynamo.events.publisher import EvidencePublisher
from semblend_dynamo.events.schemas import deployment_digest
from semblend_dynamo.events.subscriber import EventSubscriber
from semblend_dynamo.namespace import ModelIdentity, tenant_of
from semblend_dynamo.router.__main__ import build_discovery
from semblend_dynamo.router.catalog import DonorCatalog
from semblend_dynamo.router.handler import SemanticRouter
from semblend_dynamo.router.metrics import RouterMetrics
from tests.router.test_handler import KvRouterTestDouble

BLOCK = 16
MAX_BYTES = 65_536


def router_config(nats_url: str, **settings: Any) -> SemblendConfig:
    values: dict[str, Any] = {
        "block_size": BLOCK,
        "embedder": "hash",
        "min_span_tokens": 32,
        "min_donor_tokens": 64,
        "nats_url": nats_url,
        "max_message_bytes": MAX_BYTES,
        "dynamo_namespace": "adv",
    }
    return SemblendConfig(**(values | settings))


class InProcessRouter:
    """One router replica: start it inside a running loop, close it when done."""

    def __init__(self, cfg: SemblendConfig, *, model_id: str | None = None) -> None:
        self.cfg = cfg
        self.identity = ModelIdentity.from_config(
            cfg if model_id is None else cfg.model_copy(update={"model_id": model_id})
        )
        self.deployment = deployment_digest(self.identity.namespace())
        self.metrics = RouterMetrics()
        self.link = NatsLink(cfg, name="adversarial-router", retry_s=0.2)
        self.publisher = EvidencePublisher(
            self.link,
            queue_size=cfg.evidence_queue_size,
            on_sent=self.metrics.event_out,
            on_dropped=lambda kind, reason: self.metrics.events_dropped.labels(kind, reason).inc(),
        )
        self.kv = KvRouterTestDouble()
        self.discovery = build_discovery(cfg)
        self.router = SemanticRouter(
            cfg,
            kv_router=self.kv,
            discovery=self.discovery,
            catalog=DonorCatalog(cfg.index_capacity, self.discovery, index_dtype=cfg.index_dtype),
            link=self.link,
            publisher=self.publisher,
            metrics=self.metrics,
            namespace_of=lambda lora, salt: self.identity.namespace(lora=lora, tenant=tenant_of(salt)),
            deployment=self.deployment,
        )
        self.subscriber = EventSubscriber(
            self.link,
            max_bytes=cfg.max_message_bytes,
            deployment=self.deployment,
            on_received=lambda stream: self.metrics.events_in.labels(stream).inc(),
            on_rejected=lambda stream, reason: self.metrics.events_rejected.labels(stream, reason).inc(),
        )
        self.router.subscribe(self.subscriber)
        self.link.on_reconnect.append(self.router.request_sync)

    async def start(self) -> InProcessRouter:
        self.link.start()
        self.publisher.start()
        await asyncio.wait_for(self.link.wait_connected(), 10)
        await self.round_trip()
        return self

    async def round_trip(self) -> None:
        """A PING/PONG with the server: every subscription made so far is in force."""
        assert self.link._nc is not None
        await self.link._nc.flush(timeout=10)

    def counted(self, stream: str) -> int:
        """Messages of ``stream`` accepted or rejected (every message must be one of the two)."""
        return self.subscriber.received[stream] + sum(
            n for (s, _), n in self.subscriber.rejected.items() if s == stream
        )

    def rejected(self, stream: str, reason: str) -> float:
        return self.metrics.events_rejected.labels(stream, reason)._value.get()

    async def close(self) -> None:
        await self.router.drain_registrations(timeout=5)
        if self.router.embeddings is not None:
            self.router.embeddings.close()
        self.router.close()
        await self.publisher.close()
        await self.link.close()
        if self.discovery is not None:
            self.discovery.close()
