"""NATS subjects: Dynamo's ``kv-events`` and SemBlend's subjects beside it (docs/architecture.md).

Dynamo publishes on ``namespace.<ns>.component.<comp>.endpoint.<ep>.kv-events`` (Dynamo 1.6)
and subscribes only to topics it discovered, so the ``semblend.*`` subjects under the same prefix never
collide with it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from ..config import SemblendConfig

KV_EVENTS_TOPIC = "kv-events"
EVIDENCE_TOPIC = "semblend.evidence"
DONORS_TOPIC = "semblend.donors"
OUTCOMES_TOPIC = "semblend.outcomes"
HINTS_TOPIC = "semblend.hints"
DONORS_SYNC_TOPIC = DONORS_TOPIC + ".sync"

TOPIC_BY_KIND: dict[str, str] = {
    "evidence": EVIDENCE_TOPIC,
    "donor": DONORS_TOPIC,
    "lifecycle": DONORS_TOPIC,
    "outcome": OUTCOMES_TOPIC,
    "hint": HINTS_TOPIC,
    "sync": DONORS_SYNC_TOPIC,
    "syncpage": DONORS_SYNC_TOPIC,
    "indexsnap": DONORS_SYNC_TOPIC,
    "indexpart": DONORS_SYNC_TOPIC,
}
"""Envelope ``topic`` of each message kind (registrations and lifecycle share the donors subject)."""

_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")


def _token(what: str, value: str) -> str:
    if not _TOKEN.match(value):
        raise ValueError(f"{what}={value!r} is not usable in a NATS subject (letters, digits, '_' and '-' only)")
    return value


class Subjects(BaseModel):
    """Every subject of one worker endpoint."""

    model_config = ConfigDict(frozen=True)

    prefix: str

    @classmethod
    def for_endpoint(cls, namespace: str, component: str, endpoint: str) -> Subjects:
        return cls(
            prefix=f"namespace.{_token('namespace', namespace)}.component.{_token('component', component)}"
            f".endpoint.{_token('endpoint', endpoint)}"
        )

    @classmethod
    def for_config(cls, cfg: SemblendConfig) -> Subjects:
        """Subjects of the workers' endpoint (``dynamo_namespace``/``worker_component``/``worker_endpoint``)."""
        return cls.for_endpoint(cfg.dynamo_namespace, cfg.worker_component, cfg.worker_endpoint)

    def topic(self, topic: str) -> str:
        return f"{self.prefix}.{topic}"

    @property
    def kv_events(self) -> str:
        return self.topic(KV_EVENTS_TOPIC)

    @property
    def evidence(self) -> str:
        return self.topic(EVIDENCE_TOPIC)

    @property
    def donors(self) -> str:
        return self.topic(DONORS_TOPIC)

    @property
    def donors_sync(self) -> str:
        """Where a router asks its peers for their donor registrations, a page per request (reply = its inbox)."""
        return self.topic(DONORS_SYNC_TOPIC)

    @property
    def outcomes(self) -> str:
        return self.topic(OUTCOMES_TOPIC)

    def hints(self, worker_id: int) -> str:
        """Per-worker hint subject (``...semblend.hints.<worker_id as 16 hex digits>``)."""
        return self.topic(f"{HINTS_TOPIC}.{worker_id:016x}")
