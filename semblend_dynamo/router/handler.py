"""The SemBlend router's request path and its event handlers.

:meth:`SemanticRouter.generate` is the Dynamo endpoint handler. Per request:

1. exact first: Dynamo's own overlap (``KvRouter.get_overlap_scores``, with the request's LoRA and cache
   namespace). Coverage at or above ``exact_route_threshold`` -> ``exact_prefix_route``, no semantic work. While the
   query is in flight the loop searches the request's token-exact spans, unless the router's residency says a worker
   holds the blocks an exact win needs (then it waits, and searches only if exact does not win);
2. otherwise the core pipeline (:class:`~semblend_dynamo.pipeline.DonorDiscovery`) over the donors that
   :class:`~semblend_dynamo.router.catalog.DonorCatalog` says are resident on live workers in the request's
   namespace: token-exact spans first (on the loop: they are fast), the prompt embedding only when spans find
   nothing, computed by :class:`~semblend_dynamo.router.embedding.PromptEmbeddings` off the loop within
   ``embed_budget_ms`` (over budget or queue full: exact-only, ``embedding_overloaded``);
3. evidence with a resident primary donor whose worker is within ``placement_load_slack`` of the least
   loaded worker -> ``semantic_placement``: the request goes out with ``routing.allowed_worker_ids =
   [donor worker]`` (Dynamo still applies its own load logic and books the request), and a
   :class:`~semblend_dynamo.events.schemas.DonorHint` is published on the donor worker's NATS hint subject before
   the request is forwarded (the one way a hint reaches the connector: ``dynamo.trtllm`` hands TensorRT-LLM none
   of the request's ``extra_args``; docs/router.md). ``discovery_only`` mode,
   an overloaded donor worker or NATS being down give ``semantic_discovery_only`` / exact-only routing;
   no evidence gives ``exact_prefix_route`` (some exact overlap) or ``cold_fallback``;
4. after the stream, :class:`RouteEvidence` is published and the prompt becomes a donor on the worker
   that served it (a :class:`DonorRegistration` every replica indexes). Its block hashes and registration are
   computed off the loop (one ``semblend-donors`` thread); only the publish comes back to the loop. Indexing it for
   discovery happens later still, on the catalog's indexer thread, once its blocks show up as kv-events.

With ``chain_enabled`` in shifted mode, a placement whose plan was declined only because the spans sit behind the
recipient's own words may run as a prefill chain (:mod:`semblend_dynamo.chain`): prefill-only steps on the donor's
worker under the recipient's isolating salt, then the request itself (:meth:`SemanticRouter._run_chain`).

Nothing on this path fails a request because of the semantic stage: every error there becomes a counted
decline and the request is forwarded unrestricted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from dynamo.llm import compute_block_hash_for_seq
from nats.aio.msg import Msg

from ..chain import ChainSettings, plan_chain
from ..config import SemblendConfig
from ..events.codec import RejectedMessage, kv_events_from_dump
from ..events.link import NatsLink
from ..events.publisher import EvidencePublisher
from ..events.schemas import (
    SYNC_PAGE_OVERHEAD,
    DonorHint,
    DonorLifecycle,
    DonorRegistration,
    DonorSyncPage,
    DonorSyncRequest,
    IndexSnapshotPart,
    IndexSnapshotRequest,
    KvEvent,
    KvEventBatch,
    OutcomeReport,
    RouteEvidence,
    SemblendEvent,
    recipient_hint,
    request_key,
    u32_tokens,
)
from ..events.subjects import Subjects
from ..events.subscriber import EventSubscriber
from ..namespace import NamespaceKey, isolating_salt
from ..outcomes import DeclineReason, Outcome
from ..pipeline import DiscoveryResult, DonorDiscovery
from ..policy import DonorPolicy, Tenancy
from ..span_aligner import Span
from .catalog import DonorCatalog
from .embedding import EmbeddingUnavailable, PromptEmbeddings
from .gc_freeze import SyncGcFreeze
from .heap import trim_heap
from .index_sync import MAX_BYTES_PER_DONOR, PART_OVERHEAD, PARTS_PER_S, SnapshotFetch, SnapshotServer
from .indexer import RequestGate
from .metrics import RouterMetrics
from .prefill_chain import ChainStepFailed, chain_hints, run_step, salted, served_worker, step_request
from .sync import (
    ADD_DELAY_S,
    REPLY_TIMEOUT_S,
    RETRIES,
    HeldPages,
    SyncLimiter,
    SyncSession,
    build_page,
    check_request,
    sync_inbox,
)

log = logging.getLogger(__name__)

GAP_RESYNC_DELAY_S = 1.0
KV_FLUSH_RETRY_S = 0.001
"""A kv-event batch that found the catalog's lock held by another thread is applied this soon after (or by the next
batch), retried until the lock is free."""
SETTLE_DELAY_S = 0.5
"""How soon after a change of the block maps the loop starts finishing the base rewrites changes left in progress
(while changes go on they pace the rewrites themselves)."""
SETTLE_ENTRIES = 65_536
"""Block-map entries written per loop turn while settling (~1 MiB copied; a turn, not a whole map, at a time)."""
TRIM_AFTER_SETTLED = 1 << 18
"""Entries settled (each rewrite frees an old base of 16 B an entry: 4 MiB) before the heap is handed back to the OS
(at 1 << 20, a late replica's last ~800K settled entries at 200K donors left ~22 MiB of freed heap behind)."""
QUIET_TRIM_DELAY_S = 1.0
"""How long after the last sync or index request it answered, or its own sync or index fetch ended, a replica hands
the heap they freed back to the OS (serving a 1M-donor sync leaves ~0.2 KB a donor of it)."""
MAX_PENDING_REGISTRATIONS = 1024
"""Finished prompts waiting to become donors at most (embedding, hashing); one beyond is dropped and counted."""
_GONE_REASONS = {DeclineReason.DONOR_EVICTED.value, DeclineReason.DONOR_LEASE_EXPIRED.value}
HINT_FLUSH_S = 0.005
"""The longest a request waits for the NATS server to confirm its hint (one local round trip is ~0.1 ms)."""

CHAIN_REASONS = (DeclineReason.NOT_PREFIX_CONTIGUOUS, DeclineReason.BELOW_REUSE_RATIO)
"""Plan declines a prefill chain can overcome: spans behind the recipient's own words, or too few of them at once."""


NAMESPACE_KEYS = 4096
"""Namespace keys kept made (one per LoRA and cache salt seen lately): a request of one reuses it."""

HINT_SUBJECTS = 1024
"""Hint subjects kept made (one a worker seen lately): formatting one costs more than finding it."""

UNREADABLE_SALT = object()
"""Stands for a salt the request carries where the router cannot read it (``nvext`` that is not a map)."""


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
    token_array: np.ndarray
    """``tokens`` as a read-only int64 array, converted once for the span search."""
    tenancy: Tenancy = field(default_factory=lambda: Tenancy.from_salt(None))
    """Who the request belongs to (:func:`request_tenancy`); unknown: it is its own tenant."""
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
    chain_steps: list[tuple[int, DonorHint]] = field(default_factory=list)
    """A prefill chain's steps before the request, ``(prompt tokens, hint)`` each; ``hint`` is then the last hint."""
    salt: str | None = None
    """The cache salt the router gives the request (a chain's isolating salt), replacing the caller's."""


def routing_fields(request: Mapping[str, Any]) -> tuple[str, object]:
    """``(lora_name, cache salt as sent)`` of a request.

    The cache salt is Dynamo's ``routing.cache_namespace`` (what Dynamo hashes blocks with), else the
    ``extra_args.nvext.cache_salt`` that the stock frontend passes to backends; LoRA is ``routing.lora_name``.
    The salt is returned as it came (None when absent): :func:`request_tenancy` reads it.
    """
    routing = request.get("routing") or {}
    extra = request.get("extra_args") or {}
    if not isinstance(routing, Mapping) or not isinstance(extra, Mapping):
        raise BadRequest("routing and extra_args must be maps")
    lora = routing.get("lora_name") or ""
    if not isinstance(lora, str):
        raise BadRequest("lora_name must be a string")
    salt: object = routing.get("cache_namespace")
    nvext = extra.get("nvext")
    if salt in (None, "") and nvext is not None:
        salt = nvext.get("cache_salt") if isinstance(nvext, Mapping) else UNREADABLE_SALT
    return lora, None if salt == "" else salt


def request_tenancy(salt: object) -> Tenancy:
    """The tenancy a salt establishes, read as the connector reads the engine's (``policy.Tenancy``).

    None: no salt (the default tenant ``""``); a string: the tenant before ``|``; a non-negative integer: a salt id
    (tenant ``salt-id:<id>``); anything else cannot be read, so the tenant is unknown.
    """
    if salt is None or isinstance(salt, str):
        return Tenancy.from_salt(salt)
    if type(salt) is int and salt >= 0:
        return Tenancy.from_salt_id(salt)
    return Tenancy.unknown()


class SemanticRouter:
    """Owns the decision, the forwarding and the router's side of the evidence streams."""

    def __init__(
        self,
        cfg: SemblendConfig,
        *,
        kv_router: KvRouterLike,
        discovery: DonorDiscovery | None,
        catalog: DonorCatalog,
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
        self.catalog = catalog
        self.link = link
        self.publisher = publisher
        self.metrics = metrics
        self.namespace_of = namespace_of
        # The same key object for the same LoRA and salt: no model built per request, and the key's memoized digest
        # (asked on the span path) is found by identity instead of comparing two models field by field.
        self._namespace_known = functools.lru_cache(maxsize=NAMESPACE_KEYS)(namespace_of)
        self.deployment = deployment
        self.router_id = router_id or uuid.uuid4().hex
        self.subjects = Subjects.for_config(cfg)
        self._hint_subject = functools.lru_cache(maxsize=HINT_SUBJECTS)(self.subjects.hints)
        self.policy = DonorPolicy(cfg)
        self.sync_inbox = sync_inbox(self.router_id)
        self._sync_limiter = SyncLimiter(cfg.sync_rate_per_s)
        self._sync: SyncSession | None = None
        self._sync_watch: asyncio.Future[None] | None = None
        self._sync_gc = SyncGcFreeze()
        self._held = HeldPages()
        self._held_wait: asyncio.Future[None] | None = None
        index = None if discovery is None else discovery.index
        self._snapshots = (
            SnapshotServer(index, router_id=self.router_id, deployment=deployment)
            if index is not None and index.saves_snapshots and cfg.sync_index_snapshots and catalog.indexer is not None
            else None
        )
        self._snapshot_limiter = SyncLimiter(PARTS_PER_S)
        self._want_snapshot = False
        self._snapshot_peer: str | None = None  # to ask for its search index once the sync has added its donors
        self._fetch: SnapshotFetch | None = None
        self._snapshot_ask: asyncio.Future[None] | None = None
        self._prune_loaded = False  # a snapshot was loaded: its donors the sync did not confirm leave once it ends
        self.embeddings = (
            PromptEmbeddings(
                discovery.embed_prompts, queue_size=cfg.embed_queue_size, budget_s=cfg.embed_budget_ms / 1000
            )
            if discovery is not None and discovery.embedder is not None
            else None
        )
        self._registrations: set[asyncio.Task[None]] = set()
        self._donor_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semblend-donors")
        self.gate = RequestGate()
        if discovery is not None:  # a span search started while a background step runs keeps the GIL (see there)
            discovery.aligner.hold_gil = self.gate.stepping
        if catalog.indexer is not None:
            catalog.indexer.gate = self.gate
            catalog.indexer.on_dropped = lambda kind, reason: metrics.donors_dropped.labels(kind, reason).inc()
        self._live_workers_seen = False
        self._gap_resync: asyncio.Future[None] | None = None
        self._kv_flush: asyncio.TimerHandle | None = None
        self._kv_errors_counted = 0  # of catalog.kv_errors, those in the metrics
        self._settle: asyncio.Handle | None = None
        self._settled = 0  # entries settled since the heap was last trimmed
        self._trim: asyncio.Future[bool] | None = None
        self._quiet_from = 0.0  # the last sync or index request answered, or sync or fetch ended (monotonic)
        self._quiet_trim: asyncio.TimerHandle | None = None

    # --- request path ---------------------------------------------------------------------------
    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[dict[str, Any]]:
        """Dynamo endpoint handler: decide, forward through Dynamo's KvRouter, stream back, then publish."""
        t0 = time.perf_counter()
        # Donors are indexed between requests: background steps wait while the request is decided and, unless a
        # prefill chain runs first, while its hint is written (both wait for the GIL whenever the loop lets it go).
        with self.gate.deciding():
            routed = self.parse(request, context)
            parsed_us = (time.perf_counter() - t0) * 1e6
            decision = await self.decide(routed)
            decision.latency_us["parse"] = parsed_us
            forwarded = self.forward_request(request, routed, decision)
            if decision.salt is None:
                await self._send_hint(decision)
        if decision.salt is not None:  # a prefill chain (possibly of the request alone)
            forwarded = await self._run_chain(forwarded, routed, decision)
            await self._send_hint(decision)
        decision.latency_us["total_added"] = (time.perf_counter() - t0) * 1e6
        served: tuple[int, int] | None = None
        finished = False
        try:
            async for out in self._forward(forwarded, decision):
                served = served or served_worker(out)
                yield out
            finished = True
        finally:
            self._record(routed, decision, served)
            if finished and served is not None:  # under the salt it ran with (chain steps are never donors)
                self._register_donor(replace(routed, cache_salt=decision.salt) if decision.salt else routed, served)

    async def _send_hint(self, decision: Decision) -> None:
        """The hint, if any, written to NATS before the request is forwarded (it races the request)."""
        if decision.hint is None:
            return
        t0 = time.perf_counter()
        await self.publisher.send_first(self._hint_subject(decision.hint.worker_id), decision.hint, HINT_FLUSH_S)
        decision.latency_us["hint"] = (time.perf_counter() - t0) * 1e6

    def parse(self, request: Mapping[str, Any], context: Any = None) -> RoutedRequest:
        """Validate the fields the router needs; raises :class:`BadRequest` with a clear message."""
        if not isinstance(request, Mapping):
            raise BadRequest("request must be a PreprocessedRequest map")
        tokens = request.get("token_ids")
        if not isinstance(tokens, list) or not tokens:
            raise BadRequest("token_ids must be a non-empty list of token ids")
        try:
            wire = u32_tokens(tokens)
        except (OverflowError, TypeError) as exc:
            raise BadRequest(f"token ids must be integers in [0, 2**32): {exc}") from None
        token_array = np.frombuffer(wire, dtype=np.uint32).astype(np.int64)
        token_array.flags.writeable = False
        lora, salt = routing_fields(request)
        request_id = _context_id(context) or uuid.uuid4().hex
        tenancy = request_tenancy(salt)
        # an unknown tenant is its own tenant: a namespace no other request has
        tenant = tenancy.tenant if tenancy.tenant is not None else f"tenant_unknown:{uuid.uuid4().hex}"
        cache_salt = salt if isinstance(salt, str) else ""
        # an unknown tenant's key is its request's alone: not kept
        namespace = (self._namespace_known if tenancy.tenant is not None else self.namespace_of)(
            lora, cache_salt or tenant
        )
        return RoutedRequest(
            request_id, tokens, lora, cache_salt, namespace, request_key(wire), token_array, tenancy=tenancy
        )

    async def decide(self, routed: RoutedRequest) -> Decision:
        """Exact first, then (if needed and possible) the semantic stage; never raises."""
        t0 = time.perf_counter()
        refused = self.policy.may_seek(routed.tenancy)
        if refused is None and self.discovery is None:
            refused = DeclineReason.SEMANTIC_DISABLED
        elif refused is None and not self.link.connected:
            refused = DeclineReason.DONOR_NOT_RESIDENT  # residency unknown while NATS is down
        # Dynamo's load query needs neither the exact answer nor the spans. Asked first, it runs on Dynamo's runtime
        # beside the exact query. The spans do not need the exact answer either, only the exact-wins test and the plan
        # do: when no worker holds what an exact win needs, the loop searches them while Dynamo answers. An answer's
        # delivery needs the GIL, which the search holds between its C calls: one due mid-search mostly comes after it
        # (docs/benchmarks.md, "The span search while Dynamo's exact query is in flight").
        loads = None if refused is not None else self._ask_loads(routed)
        decision = Decision(Outcome.COLD_FALLBACK)
        spans: list[Span] | None = None
        t_exact = time.perf_counter()
        asked = self._ask_exact(routed)
        if loads is not None and self.cfg.spans_during_exact:  # the loop's time while Dynamo answers
            spans = self._spans_during_exact(routed, decision)
        try:
            scores = await asked
            decision.exact_blocks = max((int(w.get("device_blocks", 0)) for w in scores.get("workers", [])), default=0)
        except Exception as exc:
            log.warning("exact overlap query failed (%s); routing without it", exc)
        decision.latency_us["exact"] = (time.perf_counter() - t_exact) * 1e6
        if loads is not None:
            decision.latency_us["ask_loads"] = (t_exact - t0) * 1e6
        exact_tokens = decision.exact_blocks * self.cfg.block_size
        if exact_tokens / len(routed.tokens) >= self.cfg.exact_route_threshold:
            decision.outcome = Outcome.EXACT_PREFIX_ROUTE
            decision.reason = DeclineReason.EXACT_PREFIX_WINS
            if loads is not None:
                loads.cancel()
            if spans is not None:
                self.metrics.spans_during_exact_of["wasted"].inc()
            return decision
        if spans is not None:
            self.metrics.spans_during_exact_of["used"].inc()
        if decision.exact_blocks:
            decision.outcome = Outcome.EXACT_PREFIX_ROUTE
        if loads is None:
            decision.reason = refused
            return decision
        try:
            await self._semantic(routed, decision, exact_tokens, loads, spans)
        except Exception:
            log.exception("semantic stage failed for %s; routing exact-only", routed.request_id)
            decision.reason = DeclineReason.INTERNAL_ERROR
            decision.hint = None
            decision.allowed_worker = None
        loads.cancel()  # unanswered and no longer needed (no donor, discovery only): nothing to wait for
        decision.latency_us["decide"] = (time.perf_counter() - t0) * 1e6
        return decision

    def _exact_may_win(self, routed: RoutedRequest) -> bool:
        """Whether Dynamo's exact answer could make exact reuse win, as far as the router's residency knows.

        A win needs one worker rank to hold the prompt's first block and the block that brings the overlap to
        ``exact_route_threshold`` (Dynamo matches whole blocks from the first), hashed as the exact query hashes them.
        The residency follows the same kv-events as Dynamo's index, a little behind it at times: a block stored just
        now may be missing, so the span search then runs for nothing (counted ``wasted``; the decision is the same).
        The same when the residency cannot be read without waiting (the donor thread changing a block map): on the
        span path exact reuse rarely wins, and a search left for after the exact answer adds all of its time there.
        """
        tokens, size = routed.tokens, self.cfg.block_size
        needed = _blocks_to_win(len(tokens), size, self.cfg.exact_route_threshold)
        if needed == 0:
            return True
        if needed > len(tokens) // size:
            return False
        # One call for both blocks: a block's hash does not depend on its position (only on its tokens, LoRA and salt)
        first_and_last = tokens[:size] + tokens[(needed - 1) * size : needed * size]
        hashes = compute_block_hash_for_seq(
            first_and_last, size, lora_name=routed.lora or None, cache_namespace=routed.cache_salt or None
        )
        return self.catalog.stored_together(hashes) is True

    def _ask_exact(self, routed: RoutedRequest) -> Awaitable[dict[str, Any]]:
        """Dynamo's exact overlap for the request, asked now (its runtime starts a query when it is called); an error
        comes out where it is awaited."""
        try:
            return self.kv_router.get_overlap_scores(
                routed.tokens, lora_name=routed.lora or None, cache_namespace=routed.cache_salt or None
            )
        except Exception as exc:
            failed: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def _spans_during_exact(self, routed: RoutedRequest, decision: Decision) -> list[Span] | None:
        """The request's spans, searched while Dynamo's exact query is in flight (timed ``spans``) unless exact reuse
        may win; None then, or on a failure (counted): the semantic stage searches as it would have."""
        assert self.discovery is not None
        t0 = time.perf_counter()
        try:
            if self._exact_may_win(routed):
                return None
            spans = self.discovery.find_spans(routed.namespace, routed.token_array)
        except Exception:
            log.exception("span search during the exact query failed for %s", routed.request_id)
            self.metrics.spans_during_exact.labels("failed").inc()
            spans = None
        decision.latency_us["spans"] = (time.perf_counter() - t0) * 1e6
        return spans

    def _ask_loads(self, routed: RoutedRequest) -> asyncio.Future[list[dict[str, int]]]:
        """Dynamo's per-worker loads, asked now; an error comes out where they are awaited.

        Only ``active_requests`` is read from the answer, and it does not depend on the tokens: the query carries the
        prompt's first block, so the runtime does not convert the whole prompt a second time (~0.2 ms at 8K).
        """
        loads: asyncio.Future[list[dict[str, int]]]
        try:
            loads = asyncio.ensure_future(self.kv_router.get_potential_loads(routed.tokens[: self.cfg.block_size]))
        except Exception as exc:
            loads = asyncio.get_running_loop().create_future()
            loads.set_exception(exc)
        loads.add_done_callback(_retrieve)
        return loads

    async def _semantic(
        self,
        routed: RoutedRequest,
        decision: Decision,
        exact_tokens: int,
        loads: Awaitable[list[dict[str, int]]],
        spans: list[Span] | None,
    ) -> None:
        """Discovery (with the spans searched during the exact query, if any), then placement and the hint."""
        assert self.discovery is not None
        t0 = time.perf_counter()
        result = self.discovery.discover(
            routed.request_id,
            routed.namespace,
            routed.token_array,
            exact_prefix_tokens=exact_tokens,
            embed=False,
            known_spans=spans,
            tenancy=routed.tenancy,
            timed=False,  # the stage is timed here, as a whole
        )
        unembedded = False  # no spans, and the prompt could not be embedded
        if not (result.spans or result.exact_wins) and self.embeddings is not None:
            try:
                vector = await self.embeddings.for_request(routed.tokens)
            except EmbeddingUnavailable as exc:
                self.metrics.embeddings.labels(exc.reason).inc()
                decision.reason = DeclineReason.EMBEDDING_OVERLOADED
                return
            self.metrics.embeddings.labels("ok" if vector is not None else "error").inc()
            unembedded = vector is None
            if vector is not None:
                result = self.discovery.discover(
                    routed.request_id,
                    routed.namespace,
                    routed.token_array,
                    exact_prefix_tokens=exact_tokens,
                    prompt_vector=vector,
                    known_spans=result.spans,
                    tenancy=routed.tenancy,
                    timed=False,
                )
        decision.latency_us["semantic"] = (time.perf_counter() - t0) * 1e6
        decision.reason = DeclineReason.INVALID_EMBEDDING if unembedded else result.decision.reason
        donor = self.catalog.resident_donor(result.primary_donor) if result.primary_donor else None
        if donor is None:
            decision.reason = decision.reason or DeclineReason.NO_CANDIDATE
            return
        worker_id, dp_rank = donor.worker
        outcome = Outcome.SEMANTIC_DISCOVERY_ONLY
        if self.cfg.discovery_only:
            decision.reason = DeclineReason.DISCOVERY_ONLY
        elif await self._within_load(loads, worker_id, decision):
            outcome = Outcome.SEMANTIC_PLACEMENT
            decision.allowed_worker = worker_id
        else:
            decision.reason = DeclineReason.CAPACITY
        decision.outcome = outcome
        decision.hint = self._hint(routed, result, donor.donor_id, donor.donor_key, worker_id, dp_rank, outcome)
        if outcome is Outcome.SEMANTIC_PLACEMENT and (decision.reason in CHAIN_REASONS or result.decision.accepted):
            self._plan_chain(routed, result, decision, decision.hint)

    def _plan_chain(
        self, routed: RoutedRequest, result: DiscoveryResult, decision: Decision, recipient: DonorHint
    ) -> None:
        """Turn a placement into a prefill chain when chains are on, the engine reuses salted blocks, it pays and it
        loads more than the plain plan would."""
        cfg = self.cfg
        tenant = routed.tenancy.tenant
        if not cfg.chain_enabled or cfg.mode != "shifted" or cfg.isolation != "cache_salt":
            return
        if tenant is None or routed.tenancy.salt_id is not None:
            return  # the chain's salt must be a string of the request's own tenant
        keys: dict[str, str | None] = {}
        for span in result.spans:  # every load comes from a donor resident on the chain's worker
            donor = self.catalog.resident_donor(span.donor_id)
            if donor is not None and donor.worker == (recipient.worker_id, recipient.dp_rank):
                keys[span.donor_id] = donor.donor_key
        spans = [s for s in result.spans if s.donor_id in keys]
        chain = plan_chain(len(routed.tokens), spans, ChainSettings.from_config(cfg))
        if not chain.accepted or chain.plan is None:
            return
        plain = result.decision.plan if result.decision.accepted else None
        if plain is not None and chain.plan.loaded_tokens <= plain.reused_tokens:
            return  # the plain load already takes as much: no steps needed
        *steps, (_, final) = chain_hints(chain.plan, routed.tokens, recipient, keys, cfg.chain_head_tokens)
        decision.chain_steps, decision.hint, decision.reason = steps, final, None
        decision.salt = isolating_salt(tenant, routed.trace_id)

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
        return recipient_hint(  # DonorHint(...), not validated again where the fields are what validation stores
            request_key=routed.key,
            request_id=routed.request_id,
            donor_id=donor_id,
            donor_key=donor_key,
            worker_id=worker_id,
            dp_rank=dp_rank,
            namespace=result.namespace,  # routed.namespace's digest, as discovery computed it
            similarity=result.hits.get(donor_id),  # the donor's candidate's similarity (None: not a hit)
            spans=[(s.donor_start, s.target_start, s.length) for s in spans if s.donor_id == donor_id],
            decision=outcome,
            trace_id=routed.trace_id,
        )

    async def _within_load(self, loads: Awaitable[list[dict[str, int]]], worker_id: int, decision: Decision) -> bool:
        """False when the donor's worker is busier than the least loaded one by more than the slack.

        ``loads``: Dynamo's potential loads for the request, asked just before the exact query; the ``load`` stage
        is what the request still waited for them after its span search.
        """
        t0 = time.perf_counter()
        rows = await loads
        decision.latency_us["load"] = (time.perf_counter() - t0) * 1e6
        active = {int(w["worker_id"]): int(w.get("active_requests", 0)) for w in rows}
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

    async def _run_chain(self, forwarded: dict[str, Any], routed: RoutedRequest, decision: Decision) -> dict[str, Any]:
        """Run the chain's steps in order on its worker; the request to forward after them.

        Each step is hinted, then sent with the chain's salt and waited for (``chain_step_timeout_s``, cancelled past
        it). A step that fails sends the request cold: no hint, no pin, a fresh salt (it must not meet the steps'
        blocks), decline ``chain_step_failed``.
        """
        assert decision.allowed_worker is not None and decision.salt is not None
        t0 = time.perf_counter()
        forwarded = salted(forwarded, decision.salt)
        try:
            for done, (prompt_tokens, hint) in enumerate(decision.chain_steps):
                await self.publisher.send_first(self._hint_subject(hint.worker_id), hint, HINT_FLUSH_S)
                step = step_request(forwarded, prompt_tokens)
                try:
                    await run_step(
                        self.kv_router.generate_from_request,
                        step,
                        decision.allowed_worker,
                        self.cfg.chain_step_timeout_s,
                    )
                except ChainStepFailed as exc:
                    self.metrics.chain_steps.labels(exc.result).inc()
                    log.warning(
                        "chain step %d/%d of %s failed (%s); running it cold",
                        done + 1,
                        len(decision.chain_steps),
                        routed.request_id,
                        exc,
                    )
                    return self._chain_failed(forwarded, routed, decision)
                self.metrics.chain_steps.labels("ok").inc()
            return forwarded
        finally:
            decision.latency_us["chain_steps"] = (time.perf_counter() - t0) * 1e6

    def _chain_failed(self, forwarded: dict[str, Any], routed: RoutedRequest, decision: Decision) -> dict[str, Any]:
        assert routed.tenancy.tenant is not None
        decision.outcome, decision.reason = Outcome.COLD_FALLBACK, DeclineReason.CHAIN_STEP_FAILED
        decision.hint, decision.allowed_worker = None, None
        decision.salt = isolating_salt(routed.tenancy.tenant, f"{routed.trace_id}-cold")
        routing = dict(forwarded.get("routing") or {})
        routing.pop("allowed_worker_ids", None)
        return salted(dict(forwarded, routing=routing), decision.salt)

    async def _forward(self, request: dict[str, Any], decision: Decision) -> AsyncIterator[dict[str, Any]]:
        """Forward through Dynamo; a restricted placement that fails before any output is retried unrestricted."""
        t0 = time.perf_counter()
        first = True
        try:
            stream = await self.kv_router.generate_from_request(request)
            async for out in stream:
                if first:
                    decision.latency_us["forward_first_response"] = (time.perf_counter() - t0) * 1e6
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
        for stage, us in decision.latency_us.items():  # observed here, after the stream: off the request's path
            self.metrics.stage_latency.labels(stage).observe(us / 1e6)
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
            "routed request=%s trace=%s outcome=%s reason=%s worker=%s exact_blocks=%d donor=%s stages_us=%s",
            routed.request_id,
            routed.trace_id,
            decision.outcome.value,
            decision.reason.value if decision.reason else None,
            f"{served[0]:x}" if served else None,
            decision.exact_blocks,
            decision.hint.donor_id if decision.hint else None,
            ",".join(f"{stage}:{us:.0f}" for stage, us in decision.latency_us.items()),
        )

    # --- donors ---------------------------------------------------------------------------------
    def _register_donor(self, routed: RoutedRequest, served: tuple[int, int]) -> None:
        """The finished prompt becomes a donor on the worker that served it (embedded off the loop, after requests)."""
        if len(routed.tokens) < max(self.cfg.min_donor_tokens, self.cfg.block_size):
            return
        if self.policy.may_seek(routed.tenancy) is not None or routed.tenancy.salt_id is not None:
            return  # an unknown tenant gives nothing; a salt id's blocks cannot be hashed as the engine hashes them
        if len(self._registrations) >= MAX_PENDING_REGISTRATIONS:
            self.metrics.donors_dropped.labels("registration", "queue_full").inc()
            return
        task = asyncio.ensure_future(self._register(routed, served))
        self._registrations.add(task)
        task.add_done_callback(self._registrations.discard)

    async def _register(self, routed: RoutedRequest, served: tuple[int, int]) -> None:
        vector = await self.embeddings.for_donor(routed.tokens) if self.embeddings is not None else None
        loop = asyncio.get_running_loop()
        registration = await loop.run_in_executor(self._donor_executor, self._add_donor, routed, served, vector)
        self.publisher.offer(self.subjects.donors, registration)
        self._settle_soon()

    def _add_donor(self, routed: RoutedRequest, served: tuple[int, int], vector: Any) -> DonorRegistration:
        """The donor's registration, added to the catalog (``semblend-donors`` thread: hashing 8K tokens takes
        0.1-0.2 ms, the add 1-2 ms; each step waits for requests being decided)."""
        try:
            return self._add_donor_steps(routed, served, vector)
        finally:
            self.gate.rest()

    def _add_donor_steps(self, routed: RoutedRequest, served: tuple[int, int], vector: Any) -> DonorRegistration:
        self.gate.wait()
        worker_id, dp_rank = served
        hashes = compute_block_hash_for_seq(
            routed.tokens, self.cfg.block_size, lora_name=routed.lora or None, cache_namespace=routed.cache_salt or None
        )
        self.gate.wait()
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
        self.catalog.add(registration, local=(routed.namespace, routed.tokens))
        return registration

    def refresh_gauges(self) -> None:
        """Called before each metrics scrape: the donor gauges cost a pass over the catalog, so not per event."""
        if self.catalog.indexer is not None:
            self.metrics.indexer_backlog.set(self.catalog.indexer.backlog)
            self.metrics.indexer_held.set(self.catalog.indexer.held)
        self.metrics.maps_rewrite_left.set(self.catalog.maps_rewrite_left())
        if not self.catalog.changed:
            return
        self.catalog.changed = False
        self.metrics.donors_total.set(len(self.catalog))
        self.metrics.donors.clear()
        for (worker_id, dp_rank), (total, resident) in self.catalog.donors_per_worker().items():
            self.metrics.donors.labels(f"{worker_id:x}", str(dp_rank), "indexed").set(total)
            self.metrics.donors.labels(f"{worker_id:x}", str(dp_rank), "resident").set(resident)

    async def drain_registrations(self, timeout: float = 10.0) -> None:
        """Wait for donor registrations still being computed, then for the catalog's indexer (tests, shutdown); an
        indexer held by a sync is let go first (the sync's next add holds it again)."""
        deadline = time.monotonic() + timeout
        if self._registrations:
            await asyncio.wait(list(self._registrations), timeout=timeout)
        if self.catalog.indexer is not None:
            self.catalog.indexer.hold(False)
        await asyncio.to_thread(self.catalog.drain, max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Stop the donor thread and the catalog's indexer (what it has queued is applied or counted)."""
        self._donor_executor.shutdown(wait=True, cancel_futures=True)
        if self._kv_flush is not None:
            self._kv_flush.cancel()
        if self._settle is not None:
            self._settle.cancel()
        if self._quiet_trim is not None:
            self._quiet_trim.cancel()
        if self._held_wait is not None:
            self._held_wait.cancel()
        self._held.seal()
        while self._add_held_chunk():  # sync pages held are added, never dropped
            pass
        self._sync_gc.thaw()
        self.catalog.close()
        if self._snapshots is not None:
            self._snapshots.close()
        if self._fetch is not None:
            self._fetch.close()
            self._fetch = None

    # --- event handlers -------------------------------------------------------------------------
    def subscribe(self, subscriber: EventSubscriber, *, kv_events: bool = True) -> None:
        """Every subject the router consumes, each with its decoder and its counted stream.

        ``kv_events=False``: Dynamo's kv-events come another way (the zmq event plane's index follower).
        """
        subjects = self.subjects
        if kv_events:
            subscriber.kv_events(subjects.kv_events, self.on_kv_events)
        subscriber.semblend(subjects.donors, (DonorRegistration, DonorLifecycle), self.on_donor_event, stream="donors")
        subscriber.semblend(self.sync_inbox, (DonorSyncPage, IndexSnapshotPart), self.on_sync_page, stream="sync_pages")
        subscriber.semblend(subjects.outcomes, (OutcomeReport,), self.on_outcome, stream="outcomes")
        subscriber.semblend(
            subjects.donors_sync, (DonorSyncRequest, IndexSnapshotRequest), self.on_sync_request, stream="donors_sync"
        )

    def on_kv_events(self, batch: KvEventBatch) -> None:
        """Called for each decoded kv-events message."""
        gaps = self.catalog.apply_kv_events(batch.events)
        self.metrics.kv_blocks_in.inc(sum(event.num_blocks for event in batch.events))
        self.metrics.kv_ingest_lag.observe(max(0.0, time.time() - batch.published_at / 1000))
        self._kv_applied(gaps)

    def _kv_applied(self, gaps: int) -> None:
        """Start a resync for event-id gaps; while batches wait for the catalog's lock (another thread held it when
        they came: the loop does not wait for it), try again shortly. Queued batches that failed to apply are counted
        as a batch failing in its message's handler is."""
        failed = self.catalog.kv_errors - self._kv_errors_counted
        if failed:
            self._kv_errors_counted += failed
            self.metrics.events_rejected.labels("kv_events", "handler_error").inc(failed)
        if gaps and self._gap_resync is None:
            self._gap_resync = asyncio.ensure_future(self._resync_after_gap())
        self._settle_soon()
        if self.catalog.kv_queued and self._kv_flush is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside the loop (tests): the next batch or write applies them
                return
            self._kv_flush = loop.call_later(KV_FLUSH_RETRY_S, self._flush_kv_events)

    def _flush_kv_events(self) -> None:
        self._kv_flush = None
        self._kv_applied(self.catalog.flush_kv_events())

    def _settle_soon(self) -> None:
        """After a change of the block maps: finish the base rewrites it leaves in progress soon (a map whose changes
        stop mid-rewrite holds its old base and the part of the new one written; at 1M donors ~0.4 KB a donor)."""
        if self._settle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the loop (tests): the next change on the loop schedules it
            return
        self._settle = loop.call_later(SETTLE_DELAY_S, self._settle_maps)

    @property
    def settling(self) -> bool:
        """Whether the loop is still finishing block-map rewrites, or the loop or the indexer is to hand the heap
        freed since (by rewrites, served syncs, applied changes) back to the OS."""
        indexer = self.catalog.indexer
        return (
            self._settle is not None
            or self._quiet_trim is not None
            or (self._trim is not None and not self._trim.done())
            or (indexer is not None and indexer.trim_pending)
        )

    def _trim_soon(self) -> bool:
        """Hand the freed heap back to the OS, off the loop; False when a trim is running already."""
        if self._trim is not None and not self._trim.done():
            return False
        self._trim = asyncio.ensure_future(asyncio.to_thread(trim_heap))
        return True

    def _trim_when_quiet(self) -> None:
        """A sync or index request was answered, or this replica's sync or index fetch ended: trim the heap once
        nothing of the kind has happened for :data:`QUIET_TRIM_DELAY_S`."""
        self._quiet_from = time.monotonic()
        if self._quiet_trim is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside the loop (tests)
                return
            self._quiet_trim = loop.call_later(QUIET_TRIM_DELAY_S, self._trim_if_quiet)

    def _trim_if_quiet(self) -> None:
        quiet = time.monotonic() - self._quiet_from
        if quiet < QUIET_TRIM_DELAY_S:
            self._quiet_trim = asyncio.get_running_loop().call_later(QUIET_TRIM_DELAY_S - quiet, self._trim_if_quiet)
            return
        self._quiet_trim = None
        self._trim_soon()

    def _settle_maps(self) -> None:
        """A step of the rewrites (:meth:`DonorCatalog.settle_maps`), the next on the next loop turn; later while a
        sync adds its peers' donors (they pace the rewrites) or another thread holds the catalog. Once none is left
        after a large settle, the freed heap goes back to the OS (off the loop)."""
        loop = asyncio.get_running_loop()
        session = self._sync
        left = None if session is not None and session.active else self._settle_step()
        if left is None:
            self._settle = loop.call_later(SETTLE_DELAY_S, self._settle_maps)
            return
        if left:
            self._settle = loop.call_soon(self._settle_maps)
            return
        self._settle = None
        if self._settled >= TRIM_AFTER_SETTLED and self._trim_soon():
            self._settled = 0

    def on_kv_index(self, events: Sequence[KvEvent]) -> None:
        """Called with Dynamo's whole KV index (zmq event plane): residency becomes exactly what it holds."""
        self.metrics.events_in.labels("kv_index").inc()
        changed = self.catalog.reconcile(events)
        if changed:
            self.metrics.kv_blocks_in.inc(changed)
            self._settle_soon()

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
                self.catalog.add(event)
                self._settle_soon()
        elif isinstance(event, DonorLifecycle) and event.event == "evicted":
            self.catalog.forget(event.donor_id)

    def on_outcome(self, event: SemblendEvent, msg: Msg) -> None:
        """A connector's outcome for a request; donors the backend reports gone leave the index."""
        if not isinstance(event, OutcomeReport):
            return
        self.metrics.outcomes_reported.labels(event.outcome).inc()
        if event.outcome == Outcome.BACKEND_MATERIALIZED:
            confirmed = event.materialized_tokens // self.cfg.block_size
            self.metrics.confirmed_blocks.labels(f"{event.worker_id:x}").inc(confirmed)
        if event.donor_id and event.rejection_reason in _GONE_REASONS:
            self.catalog.forget(event.donor_id)

    async def on_sync_request(self, event: SemblendEvent, msg: Msg) -> None:
        """A peer asks for a range of this replica's registrations: at most one page, to its own inbox."""
        if isinstance(event, IndexSnapshotRequest):
            await self._on_snapshot_request(event, msg)
            return
        if not isinstance(event, DonorSyncRequest) or self._refused(event, msg, self._sync_limiter):
            return
        max_bytes = self._reply_bytes()
        page = self.catalog.page(
            event.after, self.cfg.sync_page_donors, upto=event.upto, max_bytes=max_bytes - SYNC_PAGE_OVERHEAD
        )
        data, skipped = build_page(
            page.cursors,
            page.columns,
            page.more,
            event,
            router_id=self.router_id,
            deployment=self.deployment,
            last_cursor=self.catalog.last_cursor,
            max_bytes=max_bytes,
            encode=self.publisher.encode,
        )
        if skipped:
            self.metrics.events_dropped.labels("syncpage", "oversized").inc(skipped)
        self._trim_when_quiet()
        try:
            await self.link.publish(msg.reply, data)
        except ConnectionError:
            self.metrics.events_dropped.labels("syncpage", "disconnected").inc()
            return
        self.metrics.sync_replies.inc()

    def _refused(self, event: DonorSyncRequest | IndexSnapshotRequest, msg: Msg, limiter: SyncLimiter) -> bool:
        """Whether a request gets no reply: not for this router, or a counted reject (no or foreign reply subject,
        over its requester's bucket)."""
        reason = check_request(event, msg.reply, self.router_id)
        if reason is None and not limiter.allow(event.router_id):
            reason = "rate_limited"
        if reason:
            self.metrics.events_rejected.labels("donors_sync", reason).inc()
        return reason is not None

    def _reply_bytes(self) -> int:
        """The largest reply: the configured message limit, or the NATS server's if smaller."""
        return min(self.cfg.max_message_bytes, self.link.max_payload or self.cfg.max_message_bytes)

    async def _on_snapshot_request(self, event: IndexSnapshotRequest, msg: Msg) -> None:
        """A peer asks for a part of this replica's search index saved whole: one part, to its own inbox."""
        if self._refused(event, msg, self._snapshot_limiter):
            return
        if self._snapshots is None:
            part, outcome = IndexSnapshotPart(router_id=self.router_id, deployment=self.deployment), "disabled"
        else:
            part, outcome = await self._snapshots.part(event.snapshot, event.part, self._reply_bytes() - PART_OVERHEAD)
        if outcome != "sent":
            self.metrics.index_snapshots.labels("served", outcome).inc()
        self._trim_when_quiet()
        try:
            await self.link.publish(msg.reply, self.publisher.encode(part))
        except ConnectionError:
            self.metrics.events_dropped.labels("indexpart", "disconnected").inc()

    async def on_sync_page(self, event: SemblendEvent, msg: Msg) -> None:
        """A peer's page: ask for what follows it, then hold its rows; the held pages' donors are added together once
        they are :data:`~semblend_dynamo.router.sync.ADD_DONORS` or more, once no peer is being synced, or
        :data:`~semblend_dynamo.router.sync.ADD_DELAY_S` after the first was held, whichever comes first. The first
        page of a replica that wants a search index (its own empty) names the peer to ask for its index saved whole once
        the sync has added its donors."""
        if isinstance(event, IndexSnapshotPart):
            await self._on_snapshot_part(event)
            return
        if not isinstance(event, DonorSyncPage):
            return
        session = self._sync
        if session is None or event.router_id == self.router_id or (follow := session.accept(event)) is None:
            self.metrics.events_rejected.labels("sync_pages", "unsolicited").inc()
            return
        if self._want_snapshot and event.last_cursor:
            self._want_snapshot = False
            self._snapshot_peer = event.router_id
        for after, upto in follow:
            await self._ask_sync(target=event.router_id, after=after, upto=upto)
        if session.finished.get(event.router_id) == "done":
            self.metrics.sync_peers.labels("done").inc()
        if self._held.put(event.rows()) or not (session.active and session is self._sync):
            await self._add_held()
        elif self._held and (self._held_wait is None or self._held_wait.done()):
            self._held_wait = asyncio.ensure_future(self._add_held(ADD_DELAY_S))

    async def _add_held(self, delay: float = 0.0) -> None:
        """Add every held sync page's donors to the catalog, a chunk per event-loop turn (after ``delay``: the
        waiting call, cancelled by an earlier add; a cancel between its chunks leaves the rest held for that add)."""
        if delay:
            await asyncio.sleep(delay)
        elif self._held_wait is not None:
            self._held_wait.cancel()
            self._held_wait = None
        self._held.seal()
        session = self._sync
        syncing = (session is not None and session.active) or self._snapshot_peer is not None
        if self._held and syncing and self.catalog.indexer is not None:
            # before the first chunk: the catalog takes the sync's donors first, and a peer's index is loaded before
            self.catalog.indexer.hold(True)
        if self._held:
            await self._settle_before_adding()
        if self._add_held_chunk():
            while self._held:
                await asyncio.sleep(0)
                self._add_held_chunk()
        session = self._sync
        self._syncing(session is not None and session.active)
        self._settle_soon()

    async def _settle_before_adding(self) -> None:
        """Finish the block maps' rewrites in progress, a bounded step a loop turn, before held donors are added: a map
        mid-rewrite cannot write a held block's posting in place, so each would go to its overlay and grow it into
        more rewrites (a late replica's blocks recovered just before its sync leave most maps so: at 1M donors in
        process its adds took 11-22% more CPU). Stops early while another thread holds the catalog."""
        while self._settle_step():
            await asyncio.sleep(0)

    def _settle_step(self) -> int | None:
        """One bounded step of the block maps' rewrites (:meth:`DonorCatalog.settle_maps`), counted: the entries still
        to write, or None while another thread holds the catalog."""
        settled = self.catalog.settle_maps(SETTLE_ENTRIES)
        if settled is None:
            return None
        self._settled += settled[0]
        return settled[1]

    def _syncing(self, syncing: bool) -> None:
        """Whether more sync pages are awaited: while they are, the collector stays off what the sync added and the
        catalog's indexer stays held (from the sync's first add: the catalog converges first, its search index
        follows), and held while a peer's search index is still being fetched: asked for once the sync has added its
        donors (side by side, the two slowed each other on both replicas). A loaded index's donors the sync did not
        confirm leave once it has added all of its own."""
        self._sync_gc.page_added(syncing)
        if not syncing:
            self._trim_when_quiet()
            if self._snapshot_peer is not None and self._fetch is None:
                self._fetch = SnapshotFetch(self._snapshot_peer, self._snapshot_max_bytes())
                self._snapshot_peer = None
                self._snapshot_ask = asyncio.ensure_future(self._ask_snapshot(None, 0))
        indexer = self.catalog.indexer
        if indexer is not None:
            indexer.hold(syncing or self._fetch is not None)
            if not syncing and self._prune_loaded:
                self._prune_loaded = False
                indexer.prune()

    # --- a peer's search index, fetched whole -------------------------------------------------------
    def _snapshot_max_bytes(self) -> int:
        return self.cfg.index_capacity * MAX_BYTES_PER_DONOR + (1 << 20)

    def _wants_snapshot(self) -> bool:
        """Whether a sync starting now asks a peer for its search index: this replica's pipeline is empty."""
        return self._snapshots is not None and self.discovery is not None and not len(self.discovery)

    async def _ask_snapshot(self, snapshot: str | None, part: int) -> None:
        fetch = self._fetch
        assert fetch is not None
        request = IndexSnapshotRequest(
            router_id=self.router_id, deployment=self.deployment, target=fetch.peer, snapshot=snapshot, part=part
        )
        try:
            await self.link.publish(self.subjects.donors_sync, self.publisher.encode(request), reply=self.sync_inbox)
        except ConnectionError:
            return
        self.metrics.events_out.labels("indexsnap").inc()

    async def _on_snapshot_part(self, part: IndexSnapshotPart) -> None:
        fetch = self._fetch
        asks = None if fetch is None else fetch.accept(part)
        if fetch is None or (asks is None and fetch.failed is None):
            self.metrics.events_rejected.labels("sync_pages", "unsolicited").inc()
            return
        if self.catalog.indexer is not None and fetch.failed is None:
            self.catalog.indexer.hold(True)  # its adds wait for the load (the hold runs out 30 s after the last part)
        for ask in asks or ():
            await self._ask_snapshot(fetch.snapshot, ask)
        if fetch.failed is not None:
            self._fetched(0, fetch.failed)
        elif fetch.complete and not fetch.loading and fetch.path is not None and fetch.snapshot is not None:
            fetch.loading = True
            indexer = self.catalog.indexer
            assert indexer is not None
            loop = asyncio.get_running_loop()

            def done(donors: int, reason: str) -> None:  # on the indexer thread
                loop.call_soon_threadsafe(self._fetched, donors, reason)

            indexer.load_snapshot(fetch.path, fetch.snapshot, done)

    def _fetched(self, donors: int, reason: str) -> None:
        """A fetch ended: its snapshot loaded (``donors``, ``loaded``) or not (why)."""
        fetch, self._fetch = self._fetch, None
        if fetch is not None:
            fetch.close()
        self.metrics.index_snapshots.labels("fetched", reason).inc()
        if reason == "loaded":
            self._prune_loaded = True
            log.info("loaded a peer's search index: %d donors", donors)
        elif reason != "none":
            log.warning("peer's search index not used (%s): the sync's donors are indexed one by one", reason)
        session = self._sync
        self._syncing((session is not None and session.active) or bool(self._held))

    def _add_held_chunk(self) -> bool:
        """Add the next chunk of held donors; False if there was none."""
        chunk = self._held.next_chunk()
        if chunk is None:
            return False
        session = self._sync
        with self._sync_gc.adding(session is not None and session.active):
            self.catalog.add_rows(chunk, skip_router=self.router_id)
        if self._sync is not None:
            self._sync.touch()
        return True

    async def request_sync(self) -> None:
        """Called on every NATS (re)connect: ask every peer for its donors (those missed meanwhile), and the first to
        answer for its search index whole if this replica's is empty."""
        self._sync = SyncSession(self.cfg.sync_window)
        self._want_snapshot = self._fetch is None and self._snapshot_peer is None and self._wants_snapshot()
        await self._ask_sync(target=None, after=0, upto=None)
        if self._sync_watch is None or self._sync_watch.done():
            self._sync_watch = asyncio.ensure_future(self._watch_sync())

    async def _watch_sync(self) -> None:
        """Ask quiet peers again, give up on those that stay quiet; ends when no peer is being synced."""
        while True:
            await asyncio.sleep(REPLY_TIMEOUT_S / 2)
            fetch = self._fetch
            if fetch is not None:
                for part in fetch.overdue(REPLY_TIMEOUT_S, RETRIES):
                    await self._ask_snapshot(fetch.snapshot, part)
                if fetch.failed is not None:
                    self._fetched(0, fetch.failed)
            session = self._sync
            if session is None or (not session.active and time.monotonic() - session.started > REPLY_TIMEOUT_S):
                await self._add_held()  # anything still held; thaws the collector
                if self._fetch is None or self._fetch.loading:
                    return
                continue
            again, abandoned = session.overdue(REPLY_TIMEOUT_S, RETRIES)
            for peer in abandoned:
                self.metrics.sync_peers.labels("abandoned").inc()
                log.warning("donor sync from peer %s given up: no reply after %d tries", peer[:8], RETRIES + 1)
            if abandoned and not session.active:
                await self._add_held()
            for peer, (after, upto) in again:
                await self._ask_sync(target=peer, after=after, upto=upto)

    async def _ask_sync(self, *, target: str | None, after: int, upto: int | None) -> None:
        request = DonorSyncRequest(
            router_id=self.router_id, deployment=self.deployment, target=target, after=after, upto=upto
        )
        try:
            await self.link.publish(self.subjects.donors_sync, self.publisher.encode(request), reply=self.sync_inbox)
        except ConnectionError:
            return
        self.metrics.events_out.labels("sync").inc()

    async def resync_blocks(self) -> bool:
        """Recover stored blocks from Dynamo's KV index (after a reconnect or a gap)."""
        try:
            events = kv_events_from_dump(await self.kv_router.dump_events())
        except RejectedMessage as exc:
            log.warning("KV index dump unusable (%s); keeping the live mirror", exc)
            return False
        self.catalog.merge_dump(events)
        self._settle_soon()
        return True

    def retain_workers(self, live_worker_ids: Sequence[int]) -> None:
        """Called when discovery's instance list changes: donors of departed workers vanish."""
        if not live_worker_ids and not self._live_workers_seen:
            return
        self._live_workers_seen = True
        removed = self.catalog.retain_workers(live_worker_ids)
        if removed:
            log.info("workers left: %d donors removed", len(removed))
            self._settle_soon()


@functools.lru_cache(maxsize=1 << 14)
def _blocks_to_win(prompt_tokens: int, block_size: int, threshold: float) -> int:
    """The fewest exact blocks whose tokens reach ``threshold`` of the prompt, by :meth:`SemanticRouter.decide`'s own
    test (``blocks * block_size / prompt_tokens >= threshold``). Memoized: the exact-wins gate asks it per request."""
    blocks = max(0, math.ceil(threshold * prompt_tokens / block_size))
    while blocks and (blocks - 1) * block_size / prompt_tokens >= threshold:
        blocks -= 1
    while blocks * block_size / prompt_tokens < threshold:
        blocks += 1
    return blocks


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A load query whose answer went unused still has its error read (no 'never retrieved' warning)."""
    if not future.cancelled():
        future.exception()


def _context_id(context: Any) -> str | None:
    getter = getattr(context, "id", None)
    if callable(getter):
        try:
            value = getter()
        except Exception:
            return None
        return str(value) if value else None
    return None
