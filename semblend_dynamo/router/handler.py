"""The SemBlend router's request path and its event handlers.

:meth:`SemanticRouter.generate` is the Dynamo endpoint handler. Per request:

1. exact first: Dynamo's own overlap (``KvRouter.get_overlap_scores``, with the request's LoRA and cache
   namespace). Coverage at or above ``exact_route_threshold`` -> ``exact_prefix_route``, no semantic work;
2. otherwise the core pipeline (:class:`~semblend_dynamo.pipeline.DonorDiscovery`) over the donors that
   :class:`~semblend_dynamo.router.residency.Residency` says are resident on live workers in the request's
   namespace: token-exact spans first, the prompt embedding only when spans find nothing
   (:func:`discover_resident`);
3. evidence with a resident primary donor whose worker is within ``placement_load_slack`` of the least
   loaded worker -> ``semantic_placement``: the request goes out with ``routing.allowed_worker_ids =
   [donor worker]`` (Dynamo still applies its own load logic and books the request), and a
   :class:`~semblend_dynamo.events.schemas.DonorHint` is published on the donor worker's NATS hint subject before
   the request is forwarded (the one way a hint reaches the connector: ``dynamo.trtllm`` hands TensorRT-LLM none
   of the request's ``extra_args``; docs/router.md). ``discovery_only`` mode,
   an overloaded donor worker or NATS being down give ``semantic_discovery_only`` / exact-only routing;
   no evidence gives ``exact_prefix_route`` (some exact overlap) or ``cold_fallback``;
4. after the stream, :class:`RouteEvidence` is published and the prompt becomes a donor on the worker
   that served it (a :class:`DonorRegistration` every replica indexes).

Nothing on this path fails a request because of the semantic stage: every error there becomes a counted
decline and the request is forwarded unrestricted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from dynamo.llm import compute_block_hash_for_seq
from nats.aio.msg import Msg

from ..config import SemblendConfig
from ..events.codec import RejectedMessage, kv_events_from_dump
from ..events.link import NatsLink
from ..events.publisher import EvidencePublisher
from ..events.schemas import (
    DonorHint,
    DonorLifecycle,
    DonorRegistration,
    KvEvent,
    KvEventBatch,
    OutcomeReport,
    RouteEvidence,
    SemblendEvent,
    request_key,
)
from ..events.subjects import Subjects
from ..namespace import NamespaceKey
from ..outcomes import DeclineReason, Outcome
from ..pipeline import DiscoveryResult, DonorDiscovery
from .metrics import RouterMetrics
from .residency import Residency

log = logging.getLogger(__name__)

GAP_RESYNC_DELAY_S = 1.0
PENDING_LOCAL_DONORS = 4096
"""Prompts registered here whose blocks have not shown up yet (their tokens wait for residency)."""
_GONE_REASONS = {DeclineReason.DONOR_EVICTED.value, DeclineReason.DONOR_LEASE_EXPIRED.value}


class KvRouterLike(Protocol):
    """The part of ``dynamo.llm.KvRouter`` the router uses."""

    async def get_overlap_scores(
        self, token_ids: list[int], *, lora_name: str | None = None, cache_namespace: str | None = None
    ) -> dict[str, Any]: ...

    async def get_potential_loads(self, token_ids: list[int]) -> list[dict[str, int]]: ...

    async def generate_from_request(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]: ...

    async def dump_events(self) -> str: ...


class BadRequest(ValueError):
    """The request cannot be routed as given; the message says why (returned to the caller)."""


@dataclass
class RoutedRequest:
    """What the router extracted from one PreprocessedRequest."""

    request_id: str
    tokens: list[int]
    lora: str
    cache_salt: str
    namespace: NamespaceKey
    key: str
    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    """Put in the hint and the evidence: the connector's audit records of this request carry it too."""


@dataclass
class Decision:
    """The router's verdict for one request, filled in stage by stage."""

    outcome: Outcome
    exact_blocks: int = 0
    reason: DeclineReason | None = None
    hint: DonorHint | None = None
    allowed_worker: int | None = None
    latency_us: dict[str, float] = field(default_factory=dict)


def routing_fields(request: Mapping[str, Any]) -> tuple[str, str]:
    """``(lora_name, cache_salt)`` of a request.

    The cache salt is Dynamo's ``routing.cache_namespace`` (what Dynamo hashes blocks with), else the
    ``extra_args.nvext.cache_salt`` that the stock frontend passes to backends; LoRA is ``routing.lora_name``.
    """
    routing = request.get("routing") or {}
    extra = request.get("extra_args") or {}
    if not isinstance(routing, Mapping) or not isinstance(extra, Mapping):
        raise BadRequest("routing and extra_args must be maps")
    nvext = extra.get("nvext") or {}
    salt = routing.get("cache_namespace") or (nvext.get("cache_salt") if isinstance(nvext, Mapping) else None) or ""
    lora = routing.get("lora_name") or ""
    if not isinstance(salt, str) or not isinstance(lora, str):
        raise BadRequest("cache namespace / lora_name must be strings")
    return lora, salt


class SemanticRouter:
    """Owns the decision, the forwarding and the router's side of the evidence streams."""

    def __init__(
        self,
        cfg: SemblendConfig,
        *,
        kv_router: KvRouterLike,
        discovery: DonorDiscovery | None,
        residency: Residency,
        link: NatsLink,
        publisher: EvidencePublisher,
        metrics: RouterMetrics,
        namespace_of: Callable[[str, str], NamespaceKey],
        deployment: str,
        router_id: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.kv_router = kv_router
        self.discovery = discovery
        self.residency = residency
        self.link = link
        self.publisher = publisher
        self.metrics = metrics
        self.namespace_of = namespace_of
        self.deployment = deployment
        self.router_id = router_id or uuid.uuid4().hex
        self.subjects = Subjects.for_config(cfg)
        self.sync_inbox = f"_INBOX.semblend.{self.router_id}"
        self._embedding_tasks: set[asyncio.Future[Any]] = set()
        self._live_workers_seen = False
        self._gap_resync: asyncio.Future[None] | None = None
        self._local_tokens: OrderedDict[str, tuple[NamespaceKey, list[int]]] = OrderedDict()
        self._gauges_stale = True

    # --- request path ---------------------------------------------------------------------------
    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[dict[str, Any]]:
        """Dynamo endpoint handler: decide, forward through Dynamo's KvRouter, stream back, then publish."""
        t0 = time.perf_counter()
        routed = self.parse(request, context)
        decision = await self.decide(routed)
        forwarded = self.forward_request(request, routed, decision)
        if decision.hint is not None:  # queued before the request is forwarded
            self.publisher.offer(self.subjects.hints(decision.hint.worker_id), decision.hint)
        decision.latency_us["total_added"] = (time.perf_counter() - t0) * 1e6
        served: tuple[int, int] | None = None
        finished = False
        try:
            async for out in self._forward(forwarded, decision):
                served = served or _served_worker(out)
                yield out
            finished = True
        finally:
            self._record(routed, decision, served)
            if finished and served is not None:
                self._register_donor(routed, served)

    def parse(self, request: Mapping[str, Any], context: Any = None) -> RoutedRequest:
        """Validate the fields the router needs; raises :class:`BadRequest` with a clear message."""
        if not isinstance(request, Mapping):
            raise BadRequest("request must be a PreprocessedRequest map")
        tokens = request.get("token_ids")
        if not isinstance(tokens, list) or not tokens:
            raise BadRequest("token_ids must be a non-empty list of token ids")
        try:
            key = request_key(tokens)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        lora, salt = routing_fields(request)
        request_id = _context_id(context) or uuid.uuid4().hex
        return RoutedRequest(request_id, tokens, lora, salt, self.namespace_of(lora, salt), key)

    async def decide(self, routed: RoutedRequest) -> Decision:
        """Exact first, then (if needed and possible) the semantic stage; never raises."""
        t0 = time.perf_counter()
        try:
            scores = await self.kv_router.get_overlap_scores(
                routed.tokens, lora_name=routed.lora or None, cache_namespace=routed.cache_salt or None
            )
            exact_blocks = max((int(w.get("device_blocks", 0)) for w in scores.get("workers", [])), default=0)
        except Exception as exc:
            log.warning("exact overlap query failed (%s); routing without it", exc)
            exact_blocks = 0
        decision = Decision(Outcome.COLD_FALLBACK, exact_blocks=exact_blocks)
        decision.latency_us["exact"] = (time.perf_counter() - t0) * 1e6
        self.metrics.stage_latency.labels("exact").observe(decision.latency_us["exact"] / 1e6)
        exact_tokens = exact_blocks * self.cfg.block_size
        if exact_tokens / len(routed.tokens) >= self.cfg.exact_route_threshold:
            decision.outcome = Outcome.EXACT_PREFIX_ROUTE
            decision.reason = DeclineReason.EXACT_PREFIX_WINS
            return decision
        if exact_blocks:
            decision.outcome = Outcome.EXACT_PREFIX_ROUTE
        if not self.cfg.enabled or self.discovery is None:
            decision.reason = DeclineReason.SEMANTIC_DISABLED
            return decision
        if not self.link.connected:
            decision.reason = DeclineReason.DONOR_NOT_RESIDENT  # residency unknown while NATS is down
            return decision
        try:
            await self._semantic(routed, decision, exact_tokens)
        except Exception:
            log.exception("semantic stage failed for %s; routing exact-only", routed.request_id)
            decision.reason = DeclineReason.INTERNAL_ERROR
            decision.hint = None
            decision.allowed_worker = None
        return decision

    async def _semantic(self, routed: RoutedRequest, decision: Decision, exact_tokens: int) -> None:
        assert self.discovery is not None
        t0 = time.perf_counter()
        result = discover_resident(self.discovery, routed.request_id, routed.namespace, routed.tokens, exact_tokens)
        decision.latency_us["semantic"] = (time.perf_counter() - t0) * 1e6
        self.metrics.stage_latency.labels("semantic").observe(decision.latency_us["semantic"] / 1e6)
        decision.reason = result.decision.reason
        donor = self.residency.donor(result.primary_donor) if result.primary_donor else None
        if donor is None or not self.residency.is_resident(donor.donor_id):
            decision.reason = decision.reason or DeclineReason.NO_CANDIDATE
            return
        worker_id, dp_rank = donor.worker
        outcome = Outcome.SEMANTIC_DISCOVERY_ONLY
        if self.cfg.discovery_only:
            decision.reason = DeclineReason.DISCOVERY_ONLY
        elif await self._within_load(routed.tokens, worker_id):
            outcome = Outcome.SEMANTIC_PLACEMENT
            decision.allowed_worker = worker_id
        else:
            decision.reason = DeclineReason.CAPACITY
        decision.outcome = outcome
        decision.hint = self._hint(
            routed, result, donor.donor_id, donor.registration.donor_key, worker_id, dp_rank, outcome
        )

    def _hint(
        self,
        routed: RoutedRequest,
        result: DiscoveryResult,
        donor_id: str,
        donor_key: str | None,
        worker_id: int,
        dp_rank: int,
        outcome: Outcome,
    ) -> DonorHint:
        plan = result.decision.plan
        spans = plan.spans if plan is not None else result.spans
        similarity = next((c.similarity for c in result.candidates if c.donor_id == donor_id), None)
        return DonorHint(
            request_key=routed.key,
            request_id=routed.request_id,
            donor_id=donor_id,
            donor_key=donor_key,
            worker_id=worker_id,
            dp_rank=dp_rank,
            namespace=routed.namespace.digest(),
            similarity=similarity,
            spans=[(s.donor_start, s.target_start, s.length) for s in spans if s.donor_id == donor_id],
            decision=outcome,
            trace_id=routed.trace_id,
        )

    async def _within_load(self, tokens: list[int], worker_id: int) -> bool:
        """False when the donor's worker is busier than the least loaded one by more than the slack."""
        loads = await self.kv_router.get_potential_loads(tokens)
        active = {int(w["worker_id"]): int(w.get("active_requests", 0)) for w in loads}
        if worker_id not in active:
            return False
        return active[worker_id] - min(active.values()) <= self.cfg.placement_load_slack

    def forward_request(self, request: Mapping[str, Any], routed: RoutedRequest, decision: Decision) -> dict[str, Any]:
        """The PreprocessedRequest sent on: the caller's, plus the worker restriction (the hint goes on NATS)."""
        out = dict(request)
        out.setdefault("model", self.cfg.model_id)
        for key in ("stop_conditions", "sampling_options", "output_options"):
            out.setdefault(key, {})
        out.setdefault("eos_token_ids", [])
        out.setdefault("annotations", [])
        routing = dict(out.get("routing") or {})
        if routed.cache_salt and not routing.get("cache_namespace"):
            routing["cache_namespace"] = routed.cache_salt  # Dynamo hashes the request's blocks with the salt
        if decision.allowed_worker is not None:
            routing["allowed_worker_ids"] = [decision.allowed_worker]
        if routing:
            out["routing"] = routing
        return out

    async def _forward(self, request: dict[str, Any], decision: Decision) -> AsyncIterator[dict[str, Any]]:
        """Forward through Dynamo; a restricted placement that fails before any output is retried unrestricted."""
        t0 = time.perf_counter()
        first = True
        try:
            stream = await self.kv_router.generate_from_request(request)
            async for out in stream:
                if first:
                    self.metrics.stage_latency.labels("forward_first_response").observe(time.perf_counter() - t0)
                    first = False
                yield out
            return
        except Exception as exc:
            if decision.allowed_worker is None or not first:
                raise
            log.warning(
                "placement on worker %x failed before output (%s); retrying unrestricted", decision.allowed_worker, exc
            )
            self.metrics.forward_retries.labels(type(exc).__name__).inc()
        routing = dict(request.get("routing") or {})
        routing.pop("allowed_worker_ids", None)
        request = dict(request, routing=routing or None)
        decision.allowed_worker = None
        decision.outcome = Outcome.SEMANTIC_DISCOVERY_ONLY
        decision.reason = DeclineReason.CAPACITY
        async for out in await self.kv_router.generate_from_request(request):
            yield out

    def _record(self, routed: RoutedRequest, decision: Decision, served: tuple[int, int] | None) -> None:
        self.metrics.decisions.labels(decision.outcome.value).inc()
        if decision.reason is not None:
            self.metrics.declines.labels(decision.reason.value).inc()
        self.metrics.stage_latency.labels("total_added").observe(decision.latency_us.get("total_added", 0.0) / 1e6)
        if decision.hint is not None:
            hinted = sum(length for _, _, length in decision.hint.spans) // self.cfg.block_size
            self.metrics.hinted_blocks.labels(f"{decision.hint.worker_id:x}", decision.outcome.value).inc(hinted)
        evidence = RouteEvidence(
            request_id=routed.request_id,
            request_key=routed.key,
            router_id=self.router_id,
            deployment=self.deployment,
            namespace=routed.namespace.digest(),
            outcome=decision.outcome,
            decline_reason=decision.reason,
            worker_id=served[0] if served else None,
            dp_rank=served[1] if served else 0,
            prompt_tokens=len(routed.tokens),
            exact_overlap_blocks=decision.exact_blocks,
            hint=decision.hint,
            trace_id=routed.trace_id,
            stage_latency_us=decision.latency_us,
        )
        self.publisher.offer(self.subjects.evidence, evidence)
        log.info(
            "routed request=%s trace=%s outcome=%s reason=%s worker=%s exact_blocks=%d donor=%s",
            routed.request_id,
            routed.trace_id,
            decision.outcome.value,
            decision.reason.value if decision.reason else None,
            f"{served[0]:x}" if served else None,
            decision.exact_blocks,
            decision.hint.donor_id if decision.hint else None,
        )

    # --- donors ---------------------------------------------------------------------------------
    def _register_donor(self, routed: RoutedRequest, served: tuple[int, int]) -> None:
        """The finished prompt becomes a donor on the worker that served it (embedding computed off-loop)."""
        if len(routed.tokens) < max(self.cfg.min_donor_tokens, self.cfg.block_size):
            return
        future = asyncio.get_running_loop().run_in_executor(None, self._donor_registration, routed, served)
        self._embedding_tasks.add(future)
        future.add_done_callback(self._registration_ready)

    def _donor_registration(
        self, routed: RoutedRequest, served: tuple[int, int]
    ) -> tuple[DonorRegistration, RoutedRequest]:
        """Runs in a worker thread: block hashes as Dynamo computes them, plus the prompt embedding."""
        worker_id, dp_rank = served
        hashes = compute_block_hash_for_seq(
            routed.tokens, self.cfg.block_size, lora_name=routed.lora or None, cache_namespace=routed.cache_salt or None
        )
        vector = self._embed(routed.tokens)
        embedding, dim = DonorRegistration.pack_embedding(vector) if vector is not None else (b"", 0)
        namespace = routed.namespace.digest()
        registration = DonorRegistration(
            donor_id=f"{worker_id:x}:{namespace}:{routed.key}",
            donor_key=routed.key,
            router_id=self.router_id,
            worker_id=worker_id,
            dp_rank=dp_rank,
            deployment=self.deployment,
            namespace=namespace,
            num_tokens=len(routed.tokens),
            block_size=self.cfg.block_size,
            block_hashes=hashes,
            embedding=embedding,
            embedding_dim=dim,
        )
        return registration, routed

    def _embed(self, tokens: Sequence[int]) -> np.ndarray | None:
        if self.discovery is None or self.discovery.embedder is None:
            return None
        try:
            return self.discovery.embed_prompt(tokens)
        except Exception as exc:
            log.debug("donor embedding failed: %s", exc)
            return None

    def _registration_ready(self, future: asyncio.Future[Any]) -> None:
        self._embedding_tasks.discard(future)
        try:
            registration, routed = future.result()
        except Exception:
            log.exception("donor registration failed")
            return
        self._local_tokens[registration.donor_id] = (routed.namespace, routed.tokens)
        while len(self._local_tokens) > PENDING_LOCAL_DONORS:
            self._local_tokens.popitem(last=False)
        self._add_donor(registration)
        self.publisher.offer(self.subjects.donors, registration)

    def _add_donor(self, registration: DonorRegistration) -> None:
        known = self.residency.donor(registration.donor_id)
        if known is not None and known.registration.registered_at >= registration.registered_at:
            return
        for evicted in self.residency.add_donor(registration):
            self._forget_donor(evicted)
        self._apply_residency_changes()

    def _apply_residency_changes(self) -> None:
        """Keep the pipeline's donors equal to the resident ones: add on arrival, drop on eviction."""
        changes = self.residency.take_changes()
        if not changes:
            return
        for donor_id, resident in changes:
            entry = self.residency.donor(donor_id)
            if entry is None:
                continue
            if not resident:
                self._forget_donor(donor_id)
            elif self.discovery is not None:
                local = self._local_tokens.pop(donor_id, None)
                if local is not None:  # registered here: spans from its tokens, the embedding already computed
                    vector = entry.registration.vector() if entry.registration.embedding_dim else None
                    self.discovery.register_donor(donor_id, local[0], local[1], embedding=vector)
                elif self.discovery.index is not None and entry.registration.embedding_dim == self.discovery.index.dim:
                    reg = entry.registration
                    for evicted in self.discovery.index.insert(donor_id, reg.namespace, reg.vector()):
                        self._forget_donor(evicted)
        self._gauges_stale = True

    def _forget_donor(self, donor_id: str) -> None:
        self.residency.remove_donor(donor_id)
        self._local_tokens.pop(donor_id, None)
        if self.discovery is not None:
            self.discovery.remove_donor(donor_id)
            if self.discovery.index is not None:
                self.discovery.index.delete(donor_id)

    def refresh_gauges(self) -> None:
        """Called before each metrics scrape: the donor gauges cost a pass over the catalog, so not per event."""
        if not self._gauges_stale:
            return
        self._gauges_stale = False
        self.metrics.donors_total.set(len(self.residency))
        self.metrics.donors.clear()
        for (worker_id, dp_rank), (total, resident) in self.residency.donors_per_worker().items():
            self.metrics.donors.labels(f"{worker_id:x}", str(dp_rank), "indexed").set(total)
            self.metrics.donors.labels(f"{worker_id:x}", str(dp_rank), "resident").set(resident)

    async def drain_registrations(self, timeout: float = 10.0) -> None:
        """Wait for donor registrations still being computed (tests, shutdown)."""
        if self._embedding_tasks:
            await asyncio.wait(list(self._embedding_tasks), timeout=timeout)

    # --- event handlers -------------------------------------------------------------------------
    def on_kv_events(self, batch: KvEventBatch) -> None:
        """Called for each decoded kv-events message."""
        blocks = 0
        gaps = self.residency.event_gaps
        for event in batch.events:
            self.residency.apply(event)
            blocks += event.num_blocks
        self.metrics.kv_blocks_in.inc(blocks)
        self._apply_residency_changes()
        if self.residency.event_gaps > gaps and self._gap_resync is None:
            self._gap_resync = asyncio.ensure_future(self._resync_after_gap())

    def on_kv_index(self, events: Sequence[KvEvent]) -> None:
        """Called with Dynamo's whole KV index (zmq event plane): residency becomes exactly what it holds."""
        self.metrics.events_in.labels("kv_index").inc()
        changed = self.residency.reconcile(events)
        if changed:
            self.metrics.kv_blocks_in.inc(changed)
        self._apply_residency_changes()

    async def _resync_after_gap(self) -> None:
        """Missed kv-events (an event-id gap): recover from Dynamo's index once it has recovered them."""
        try:
            await asyncio.sleep(GAP_RESYNC_DELAY_S)
            await self.resync_blocks()
        finally:
            self._gap_resync = None

    def on_donor_event(self, event: SemblendEvent, msg: Msg) -> None:
        """A registration (peer or sync reply) or a connector's lifecycle event."""
        if isinstance(event, DonorRegistration):
            if event.router_id != self.router_id:
                self._add_donor(event)
        elif isinstance(event, DonorLifecycle) and event.event == "evicted":
            self._forget_donor(event.donor_id)
            self._gauges_stale = True

    def on_outcome(self, event: SemblendEvent, msg: Msg) -> None:
        """A connector's outcome for a request; donors the backend reports gone leave the index."""
        if not isinstance(event, OutcomeReport):
            return
        self.metrics.outcomes_reported.labels(event.outcome).inc()
        if event.outcome == Outcome.BACKEND_MATERIALIZED:
            confirmed = event.materialized_tokens // self.cfg.block_size
            self.metrics.confirmed_blocks.labels(f"{event.worker_id:x}").inc(confirmed)
        if event.donor_id and event.rejection_reason in _GONE_REASONS:
            self._forget_donor(event.donor_id)
            self._gauges_stale = True

    async def on_sync_request(self, msg: Msg) -> None:
        """A starting peer asks for every registration this replica holds; replies go to its inbox."""
        if not msg.reply or msg.reply == self.sync_inbox:
            return
        for i, entry in enumerate(list(self.residency.donors())):
            try:
                await self.link.publish(msg.reply, self.publisher.encode(entry.registration))
            except ConnectionError:
                return
            if i % 256 == 255:
                await asyncio.sleep(0)

    async def request_sync(self) -> None:
        """Called on every NATS (re)connect: ask peers for the registrations missed meanwhile."""
        with contextlib.suppress(ConnectionError):
            await self.link.publish(self.subjects.donors_sync, b"", reply=self.sync_inbox)

    async def resync_blocks(self) -> bool:
        """Recover stored blocks from Dynamo's KV index (after a reconnect or a gap)."""
        try:
            events = kv_events_from_dump(await self.kv_router.dump_events())
        except RejectedMessage as exc:
            log.warning("KV index dump unusable (%s); keeping the live mirror", exc)
            return False
        self.residency.merge_dump(events)
        self._apply_residency_changes()
        return True

    def retain_workers(self, live_worker_ids: Sequence[int]) -> None:
        """Called when discovery's instance list changes: donors of departed workers vanish."""
        if not live_worker_ids and not self._live_workers_seen:
            return
        self._live_workers_seen = True
        removed = self.residency.retain_workers(set(live_worker_ids))
        for donor_id in removed:
            self._forget_donor(donor_id)
        if removed:
            log.info("workers left: %d donors removed", len(removed))
            self._gauges_stale = True


def discover_resident(
    discovery: DonorDiscovery, request_id: str, namespace: NamespaceKey, tokens: Sequence[int], exact_tokens: int
) -> DiscoveryResult:
    """The router's semantic stage: token-exact spans first, the prompt embedding only when they find nothing.

    Spans are what a worker can materialize; a similarity on top of them is telemetry, so the router does
    not pay for the embedding (the slowest part of the stage, ~130 ms for MiniLM on 2 CPU cores) when spans
    already name a donor. The pipeline holds only resident donors (added and dropped on residency changes),
    so no per-request resident filter is passed.
    """
    result = discovery.discover(request_id, namespace, tokens, exact_prefix_tokens=exact_tokens, embed=False)
    if result.spans or result.exact_wins:
        return result
    return discovery.discover(request_id, namespace, tokens, exact_prefix_tokens=exact_tokens, embed=True)


def _context_id(context: Any) -> str | None:
    getter = getattr(context, "id", None)
    if callable(getter):
        try:
            value = getter()
        except Exception:
            return None
        return str(value) if value else None
    return None


def _served_worker(out: Mapping[str, Any]) -> tuple[int, int] | None:
    """The worker Dynamo sent the request to, from the first response's ``routing_data``."""
    worker = ((out.get("routing_data") or {}).get("worker_id")) or {}
    worker_id = worker.get("decode_worker_id")
    if worker_id is None:
        return None
    return int(worker_id), int(worker.get("decode_dp_rank") or 0)
