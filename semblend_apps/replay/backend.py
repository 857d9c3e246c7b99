"""The replay backend seam: what receives donors and accepted plans, and what it reports back."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from semblend_dynamo.chain import ChainPlan
from semblend_dynamo.namespace import ModelIdentity, NamespaceKey
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.pipeline import DiscoveryResult

from .workload import WorkloadDonor, WorkloadRequest

DEFAULT_AUDIT_PATH = "./semblend-audit.jsonl"


class BackendOutcome(BaseModel):
    """What a backend did with an accepted plan."""

    materialized_tokens: int = Field(ge=0)
    reason: DeclineReason | None = None
    detail: str = ""
    chain_steps: int = Field(0, ge=0, description="prefill-only steps run before the request (a prefill chain)")
    chain_step_tokens: int = Field(0, ge=0, description="tokens those steps loaded (not the request's own reuse)")


class ReplayBackend(Protocol):
    """Extension point: the backend that receives donors and accepted plans (e.g. the TRT-LLM connector harness).

    ``register_donor`` is called once per donor before the requests it serves (a donor prefill: audited with role
    ``donor_prefill``, it never loads donor KV); ``execute`` once per request whose plan was accepted, and must
    audit its own ``materialized`` / ``declined`` records under the request's ``trace_id``.
    """

    @property
    def identity(self) -> ModelIdentity:
        """The model identity of the engine behind the backend: replay's namespace keys are built from it."""
        ...

    def register_donor(self, donor: WorkloadDonor, namespace: NamespaceKey, *, trace_id: str) -> None: ...

    def execute(
        self, request: WorkloadRequest, namespace: NamespaceKey, result: DiscoveryResult, *, trace_id: str
    ) -> BackendOutcome: ...

    def execute_chain(
        self, request: WorkloadRequest, namespace: NamespaceKey, chain: ChainPlan, *, trace_id: str
    ) -> BackendOutcome:
        """Run an accepted prefill chain: its steps, then the request (audited as ``chain_step`` / ``recipient``)."""
        ...
