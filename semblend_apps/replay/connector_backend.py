"""The TensorRT-LLM connector as the backend of ``semblend-dynamo replay`` (through the PyExecutor harness).

Replay's in-process chain (exact check -> discovery -> plan) stands in for the router. This backend stands in for the
request's trip to a worker: each replay donor is prefilled through the harness and pinned by the connector (its hint
says ``role=donor_prefill``, so the connector runs it cold and none of its records counts as reuse); each
accepted plan becomes a :class:`~semblend_dynamo.events.schemas.DonorHint` (what the router would publish on the
worker's hint subject) and the request is prefilled through the harness, where the connector validates the hint
against its own state and materializes or declines. The connector's records land in replay's audit file.

Replay targets are unpinned after they run, so (as in replay's own chain) only the workload's donors are donors.
"""

from __future__ import annotations

from typing import Any

from semblend_dynamo.audit import AuditEvent, AuditRecord, AuditWriter, Role, run_audit_path
from semblend_dynamo.chain import ChainPlan, chain_requests
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.schemas import DonorHint, request_key
from semblend_dynamo.namespace import ModelIdentity, NamespaceKey, isolating_salt
from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.pipeline import DiscoveryResult
from trtllm_connector.harness import PyExecutorHarness

from .backend import DEFAULT_AUDIT_PATH, BackendOutcome
from .workload import WorkloadDonor, WorkloadRequest

POOL_BLOCKS = 32768
"""KV blocks of the harness pool: 1 layer x 1 head x 8 channels keeps it at 32 MiB of bf16."""


class RequestTrackingAuditWriter(AuditWriter):
    """An audit writer that also keeps each request's records until the backend has read them."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.by_request: dict[str, list[AuditRecord]] = {}

    def write(self, record: AuditRecord | None = None, /, *, flush: bool = True, **fields: Any) -> AuditRecord:
        rec = super().write(record, flush=flush, **fields)
        if rec.request_id is not None:
            self.by_request.setdefault(rec.request_id, []).append(rec)
        return rec


class ConnectorReplayBackend:
    """Implements replay's ``ReplayBackend`` protocol with the SemBlend connector in the PyExecutor harness."""

    def __init__(self, cfg: SemblendConfig, *, num_blocks: int = POOL_BLOCKS) -> None:
        self.audit = RequestTrackingAuditWriter(
            str(run_audit_path(cfg.audit_path or DEFAULT_AUDIT_PATH, append=cfg.audit_append))
        )
        # The engine's block reuse follows the isolation setting; prefill chains need it (each step finds the previous).
        self.harness = PyExecutorHarness.with_stand_in(
            cfg,
            num_layers=1,
            num_kv_heads=1,
            head_dim=8,
            num_blocks=num_blocks,
            audit=self.audit,
            prefix_reuse=cfg.isolation != "no_block_reuse",
        )
        self.scheduler = self.harness.scheduler
        self._donor_ids: dict[str, str] = {}  # replay donor id -> connector donor id

    @property
    def identity(self) -> ModelIdentity:
        return self.scheduler.model.identity

    def register_donor(self, donor: WorkloadDonor, namespace: NamespaceKey, *, trace_id: str) -> None:
        """Called once per replay donor, before its requests: prefill it (cold) and let the connector pin it."""
        if not donor.tokens:
            return
        self.scheduler.hints.submit(
            DonorHint(
                request_key=request_key(donor.tokens),
                request_id=donor.donor_id,
                donor_id=donor.donor_id,
                worker_id=self.scheduler.cfg.worker_id,
                namespace=namespace.digest(),
                decision=Outcome.COLD_FALLBACK,
                trace_id=trace_id,
                role=Role.DONOR_PREFILL,
            )
        )
        result = self.harness.run_request(
            donor.tokens, cache_salt=isolating_salt(donor.tenant, donor.donor_id), capture_kv=False
        )
        if result.pinned:
            self._donor_ids[donor.donor_id] = self.scheduler.registry.donor_id_for(result.request_id)

    def execute(
        self, request: WorkloadRequest, namespace: NamespaceKey, result: DiscoveryResult, *, trace_id: str
    ) -> BackendOutcome:
        """Called for a request whose plan was accepted: hint the connector, prefill, report what it did."""
        plan = result.decision.plan
        donor = result.primary_donor or (plan.spans[0].donor_id if plan and plan.spans else None)
        connector_donor = self._donor_ids.get(donor or "")
        if plan is None or connector_donor is None:
            return BackendOutcome(materialized_tokens=0, reason=DeclineReason.DONOR_NOT_RESIDENT, detail="not pinned")
        self.scheduler.hints.submit(
            DonorHint(
                request_key=request_key(request.tokens),
                request_id=request.request_id,
                donor_id=connector_donor,
                worker_id=self.scheduler.cfg.worker_id,
                namespace=namespace.digest(),
                similarity=result.best_similarity,
                spans=[(s.donor_start, s.target_start, s.length) for s in plan.spans if s.donor_id == donor],
                decision=Outcome.SEMANTIC_PLACEMENT,
                trace_id=trace_id,
            )
        )
        return self._run(request.tokens, isolating_salt(request.tenant, request.request_id))

    def execute_chain(
        self, request: WorkloadRequest, namespace: NamespaceKey, chain: ChainPlan, *, trace_id: str
    ) -> BackendOutcome:
        """Each request of the chain under the recipient's isolation salt, its load hinted; any failure runs cold."""
        salt = isolating_salt(request.tenant, request.request_id)
        step_tokens = 0
        for steps, part in enumerate(chain_requests(chain)):
            tokens = request.tokens[: part.prompt_tokens]
            role = Role.RECIPIENT if part.final else Role.CHAIN_STEP
            # Every request of the chain is hinted, so its records carry its role and the recipient's trace id; a step
            # that only computes the recipient's own words names no spans and loads nothing.
            donor = (part.load or chain.loads[0]).spans[0].donor_id
            connector_donor = self._donor_ids.get(donor)
            if connector_donor is None:
                return self._cold(request, DeclineReason.DONOR_NOT_RESIDENT, "chain donor not pinned", steps)
            spans = part.load.spans if part.load is not None else []
            self.scheduler.hints.submit(
                DonorHint(
                    request_key=request_key(tokens),
                    request_id=request.request_id,
                    donor_id=connector_donor,
                    worker_id=self.scheduler.cfg.worker_id,
                    namespace=namespace.digest(),
                    spans=[(s.donor_start, s.target_start, s.length) for s in spans if s.donor_id == donor],
                    decision=Outcome.SEMANTIC_PLACEMENT,
                    trace_id=trace_id,
                    role=role,
                    chain_head_tokens=self.scheduler.cfg.chain_head_tokens,
                )
            )
            if part.final:
                done = self._run(tokens, salt)
                return done.model_copy(update={"chain_steps": steps, "chain_step_tokens": step_tokens})
            records = self._records(tokens, salt)
            loaded = sum(r.materialized or 0 for r in records if r.event == AuditEvent.CHAIN_STEP_LOADED.value)
            if part.load is not None and not loaded:
                # The chain broke: the request must not meet the steps' blocks, so it runs cold under a fresh salt.
                return self._cold(
                    request, DeclineReason.CHAIN_STEP_FAILED, f"step {steps + 1} loaded nothing", steps + 1
                )
            step_tokens += loaded
        raise AssertionError("chain_requests always ends with the request itself")

    def _cold(self, request: WorkloadRequest, reason: DeclineReason, detail: str, steps: int) -> BackendOutcome:
        self._records(request.tokens, isolating_salt(request.tenant, f"{request.request_id}-cold"))
        return BackendOutcome(materialized_tokens=0, reason=reason, detail=detail, chain_steps=steps)

    def _records(self, tokens: list[int], salt: str) -> list[AuditRecord]:
        """Prefill ``tokens`` through the harness; the connector's records of that request."""
        run = self.harness.run_request(tokens, cache_salt=salt, capture_kv=False)
        if run.pinned:  # replay targets are not donors
            self.scheduler.evict_donor(self.scheduler.registry.donor_id_for(run.request_id))
        return self.audit.by_request.pop(str(run.request_id), [])

    def _run(self, tokens: list[int], salt: str) -> BackendOutcome:
        records = self._records(tokens, salt)
        materialized = sum(r.materialized or 0 for r in records if r.event == AuditEvent.MATERIALIZED.value)
        if materialized:
            return BackendOutcome(materialized_tokens=materialized)
        declined = [r for r in records if r.event == AuditEvent.DECLINED.value]
        if not declined:
            return BackendOutcome(materialized_tokens=0, reason=DeclineReason.INTERNAL_ERROR, detail="no decision")
        last = declined[-1]
        return BackendOutcome(
            materialized_tokens=0, reason=DeclineReason(last.rejection_reason), detail=last.detail or ""
        )

    def close(self) -> None:
        self.audit.close()
