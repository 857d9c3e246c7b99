"""The scheduler half of SemBlend's TensorRT-LLM connector (rank 0): donor lookup, validation, promises, pins and
the plan each iteration hands to the workers.

Per request, in PyExecutor's order (the worker's steps are in :mod:`trtllm_connector.worker`):

1. ``get_num_new_matched_tokens``: take the router's hint for this prompt, or look up the pinned donors; re-align
   locally, run the planner's gates and :func:`~trtllm_connector.validation.validate_load`. Only a load that passed
   everything is promised (whole blocks, at least one token left); anything else returns 0 and is audited with its
   :class:`~semblend_dynamo.outcomes.DeclineReason`. Any exception becomes ``internal_error``.
2. ``update_state_after_alloc``: remember the target's block ids; blocks newly handed to any request invalidate the
   donors that claimed them (generation bump).
3. ``build_connector_meta``: revalidate each promised donor (same generation, still pinned) and emit the plan rows
   plus the donor releases due this iteration.
4. ``request_finished``: finished prompts of at least ``min_donor_tokens`` become donors (return True = pinned) within
   the pin budget.

TensorRT-LLM 1.3+ adds ``RequestData.cache_salt`` (the tenant, :mod:`trtllm_connector.tenancy`),
``RequestData.block_hashes`` (an exact load whose donor and target blocks hash differently under the same salt is
dropped, ``block_hash_mismatch``), ``request_reset`` and ``cancel_load`` (drop or trim the promise, return its donor
leases) and per-layer-group hooks (more than one layer group is declined, ``layer_groups_unsupported``).
"""

from __future__ import annotations

import array
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from semblend_kernels.rope_delta import CopySpan, split_spans_to_plan

from semblend_dynamo.audit import AuditEvent, AuditRecord, AuditWriter, Role, audit_file, new_trace_id
from semblend_dynamo.config import ConfigError, SemblendConfig, isolation_rule_error
from semblend_dynamo.events.schemas import DonorHint, deployment_digest, request_key
from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.planner import Planner
from semblend_dynamo.policy import DonorPolicy, Lineage, Tenancy, isolation_in_force_error
from semblend_dynamo.span_aligner import Span, SpanAligner

from . import metrics
from .base import KvCacheConnectorScheduler
from .donors import Donor, DonorRegistry, shared_prefix
from .engine_state import EngineState
from .hints import HintInbox
from .metadata import ConnectorMetadata, LoadPlan
from .model_info import ModelInfo
from .outcome_link import OutcomeLink
from .tenancy import read_tenancy, refine
from .unbox import u32_prompt
from .validation import Declined, ValidatedLoad, trim_load, validate_load

logger = logging.getLogger(__name__)

LORA_ATTRS = ("lora_task_id", "py_lora_task_id")
# Enum values read on every decision, once (an enum member's ``.value`` is a Python-level descriptor).
_RECIPIENT = Role.RECIPIENT.value
_DONOR_PREFILL = Role.DONOR_PREFILL.value
_CHAIN_STEP = Role.CHAIN_STEP.value
_LINEAGE_VALUES = {lineage: lineage.value for lineage in Lineage}
_U32 = np.dtype(np.uint32)  # a dtype object: np.frombuffer resolves a scalar type on every call


def read_prompt(request: Any) -> Sequence[int]:
    """The prompt token ids of an ``LlmRequest`` (beam 0, without generated tokens), as ``get_tokens`` hands them over:
    a list from TensorRT-LLM's binding, or any sequence or integer buffer, which :func:`u32_prompt` converts."""
    tokens: Sequence[int] = request.get_tokens(0)
    prompt_len = getattr(request, "prompt_len", None)
    if isinstance(prompt_len, int) and prompt_len < len(tokens):
        tokens = tokens[:prompt_len]
    return tokens


def read_lora(request: Any) -> str:
    for name in LORA_ATTRS:
        value = getattr(request, name, None)
        if value is not None:
            return str(value)
    return ""


@dataclass(slots=True)
class _Promise:
    """A load promised in ``get_num_new_matched_tokens``, waiting for its blocks and the metadata."""

    load: ValidatedLoad
    request_key: str
    namespace: str
    promised_at: float
    lineage: Lineage
    block_ids: list[int] | None = None
    donor_ids: tuple[str, ...] = field(default=())


class SemBlendConnectorScheduler(KvCacheConnectorScheduler):
    """The leader half (rank 0): donor lookup, validation, promises, pins and the plan."""

    # Under attention DP every rank would run its own scheduler over its own pool; our pins, hints and donor ids
    # assume one scheduler per engine, so TensorRT-LLM must refuse the combination at start-up.
    supports_attention_dp = False

    def __init__(
        self,
        llm_args: Any,
        *,
        config: SemblendConfig | None = None,
        audit: AuditWriter | None = None,
        hints: HintInbox | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Built by TensorRT-LLM with ``llm_args`` only; the keyword arguments are for the harness and tests.

        Raises :class:`ConfigError` for a configuration that must not run (shifted mode without isolation, an
        isolation the engine's KV-cache config does not put in force, a block size that disagrees with the engine).
        """
        super().__init__(llm_args)
        cfg = config if config is not None else SemblendConfig.load()
        refused = isolation_rule_error(cfg.mode, cfg.isolation) or isolation_in_force_error(
            cfg, engine_block_reuse=engine_block_reuse(llm_args)
        )
        if refused is not None:
            raise ConfigError(refused)
        self.cfg = cfg
        self.policy = DonorPolicy(cfg)
        self.state = EngineState.of(llm_args)
        self.model = ModelInfo.load(cfg, llm_args)
        self.tokens_per_block = self.model.tokens_per_block
        self.audit = audit if audit is not None else self.state.audit(audit_file(cfg))
        self.hints = hints if hints is not None else self.state.hints
        self.registry = DonorRegistry(
            0, cfg.pin_ttl_s, tokens_per_block=self.tokens_per_block, worker_id=cfg.worker_id, clock=clock
        )
        self.aligner = SpanAligner(
            self.tokens_per_block, min(cfg.min_span_tokens, self.tokens_per_block), tokens_u32=True
        )
        self.planner = Planner(cfg.model_copy(update={"block_size": self.tokens_per_block}))
        deployment = deployment_digest(self.model.namespace())
        self.link = OutcomeLink.start(cfg, self.hints, deployment) if cfg.connector_nats else None
        if self.link is not None:
            self.state.publish_link(self.link)
        self._device_matched: dict[int, int] = {}
        self._tenancy: dict[int, Tenancy] = {}  # decided in get_num_new_matched_tokens, refined by RequestData
        self._lineage: dict[int, Lineage] = {}  # of the request's KV so far, until request_finished
        self._promises: dict[int, _Promise] = {}
        self._digests: dict[tuple[str, str], str] = {}
        self._worker_id = str(cfg.worker_id)
        self._tags: dict[int, dict[str, Any]] = {}  # request id -> its audit role and trace id, until it is gone
        self._engine_blocks: dict[int, tuple[list[int], str | None]] = {}  # 1.3+: block_hashes and cache_salt
        self._prompts: dict[int, array.array[int]] = {}  # the prompt as decided on (u32), a donor's tokens at finish
        self._stats = metrics.BOOK.stats()  # the per-decision metrics, summed over schedulers when scraped

    # --- TensorRT-LLM API ------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """Called once per request, on its first context chunk, after the device prefix match.

        Returns ``(tokens, False)``: tokens promised beyond ``num_computed_tokens`` (0 = run without donor KV).
        Loads are synchronous (done in this iteration's ``start_load_kv``).
        """
        started = time.perf_counter()
        request_id = _request_id(request)
        try:
            tokens = self._decide(request, num_computed_tokens, started)
        except Exception as exc:  # fail closed: the request runs cold
            logger.exception("semblend connector: decision failed for request %s", request_id)
            tokens = 0
            promise = self._promises.pop(request_id, None)
            for donor_id in promise.donor_ids if promise else ():
                self.registry.unlease(donor_id)
            try:
                self._decline(request_id, DeclineReason.INTERNAL_ERROR, started, detail=f"{type(exc).__name__}: {exc}")
            except Exception:
                logger.exception("semblend connector: could not audit the decline of request %s", request_id)
                with contextlib.suppress(Exception):
                    self.audit.flush()  # the lookup record it would have sent
        self._stats.observe(time.perf_counter() - started)
        return tokens, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int]) -> None:
        """Called right after the request's blocks were allocated (``block_ids``: all its prompt blocks)."""
        request_id = _request_id(request)
        try:
            device_blocks = self._device_matched.pop(request_id, 0) // self.tokens_per_block
            if min(block_ids, default=0) < 0:  # BAD_PAGE_INDEX: a sliding window passed these blocks
                self._drop_promise(request_id, DeclineReason.LAYER_GROUPS_UNSUPPORTED, "blocks without a page (-1)")
                block_ids = [b for b in block_ids if b >= 0]
            for donor in self.registry.note_allocation(block_ids[device_blocks:]):
                self._released(donor, DeclineReason.GENERATION_MISMATCH)
            promise = self._promises.get(request_id)
            if promise is not None:
                promise.block_ids = list(block_ids)
        except Exception as exc:
            logger.exception("semblend connector: update_state_after_alloc failed for request %s", request_id)
            self._drop_promise(request_id, DeclineReason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    def build_connector_meta(self, scheduler_output: Any) -> object:
        """Called once per iteration after allocation: the plans for this iteration's promises, and releases."""
        loads: list[LoadPlan] = []
        try:
            new_requests = list(getattr(scheduler_output, "new_requests", []))
            new_blocks = {int(rd.request_id): list(rd.new_block_ids) for rd in new_requests}
            for rd in (*new_requests, *getattr(scheduler_output, "cached_requests", ())):
                hashes = getattr(rd, "block_hashes", None)  # 1.3+: cumulative, so the latest report is the whole chain
                if hashes:
                    self._engine_blocks[int(rd.request_id)] = (hashes, getattr(rd, "cache_salt", None))
            for rd in new_requests:  # TensorRT-LLM 1.3+ hands the salt string here
                request_id = int(rd.request_id)
                decided = self._tenancy.get(request_id)
                if decided is None or (refined := refine(decided, rd)) == decided:
                    continue
                self._tenancy[request_id] = refined
                if refined.tenant != decided.tenant:  # promised under a tenant the engine now contradicts
                    self._drop_promise(request_id, DeclineReason.NAMESPACE_MISMATCH, "RequestData.cache_salt differs")
            # Promise, allocation and this call happen in one PyExecutor iteration: a promise still without blocks
            # here will never get them, so it is dropped (audited) rather than left holding its donors' leases.
            for request_id in [r for r, p in self._promises.items() if p.block_ids is None]:
                self._drop_promise(request_id, DeclineReason.INTERNAL_ERROR, "no block allocation reported")
            for request_id in list(self._promises):
                promise = self._promises.pop(request_id)
                for donor_id in promise.donor_ids:
                    self.registry.unlease(donor_id)
                try:
                    self._check_block_hashes(request_id, promise)
                    loads.append(self._plan(request_id, promise, new_blocks.get(request_id)))
                except Exception as exc:
                    self.state.taint(request_id)
                    reason = exc.reason if isinstance(exc, Declined) else DeclineReason.INTERNAL_ERROR
                    self._decline(
                        request_id, reason, promise.promised_at, key=promise.request_key, detail=f"after promise: {exc}"
                    )
            for donor in self.registry.tick():
                self._released(donor, DeclineReason.DONOR_LEASE_EXPIRED)
        except Exception as exc:
            logger.exception("semblend connector: build_connector_meta failed")
            self._decline(
                None, DeclineReason.INTERNAL_ERROR, time.perf_counter(), detail=f"build_connector_meta: {exc}"
            )
            loads = []
        releases = tuple(self.registry.take_releases())
        metrics.PINNED_BLOCKS.set(self.registry.held_blocks)
        return ConnectorMetadata(loads=tuple(loads), releases=releases)

    def request_finished(self, request: Any, cache_block_ids: list[int]) -> bool:
        """Called when a request finishes. True pins its blocks as a donor until a worker reports it saved."""
        request_id = _request_id(request)
        tenancy = self._tenancy.pop(request_id, None)
        lineage = self._lineage.pop(request_id, None)
        engine_blocks = self._engine_blocks.pop(request_id, None)
        decided_prompt = self._prompts.pop(request_id, None)
        try:
            self._device_matched.pop(request_id, None)
            if request_id in self._promises:
                self._drop_promise(request_id, DeclineReason.INTERNAL_ERROR, "request finished before its load")
            tenancy = tenancy if tenancy is not None else read_tenancy(request)
            # A request never decided on holds KV of unknown history: only exact mode cannot have made it approximate.
            lineage = lineage if lineage is not None else Lineage.of(self.policy.shifted)
            # A chain step is a prefix of its recipient, prefilled only to be loaded after: never a donor of its own.
            chain_step = self._tags.get(request_id, {}).get("role") == Role.CHAIN_STEP.value
            pinned = not chain_step and self._admit_donor(
                request, request_id, list(cache_block_ids), tenancy, lineage, engine_blocks, decided_prompt
            )
            if not pinned:
                self._tags.pop(request_id, None)
            return pinned
        except Exception:
            logger.exception("semblend connector: request_finished failed for request %s", request_id)
            return False

    # --- TensorRT-LLM 1.3+ optional hooks ---------------------------------------------------------------
    def request_reset(self, request: Any) -> None:
        """The request's allocation was released and it will run again from the start: forget everything about it.

        A promise not yet planned is dropped (its donor leases returned); the next attempt is decided afresh.
        """
        request_id = _request_id(request)
        try:
            self._drop_promise(request_id, DeclineReason.LOAD_CANCELLED, "request reset", taint=False)
            for table in (self._device_matched, self._tenancy, self._lineage, self._engine_blocks, self._prompts):
                table.pop(request_id, None)  # type: ignore[attr-defined]
            self.state.pop_taint(request_id)  # the tainted blocks went with the allocation
        except Exception:
            logger.exception("semblend connector: request_reset failed for request %s", request_id)

    def cancel_load(self, request: Any, start: int, end: int) -> None:
        """The runtime will not consume the promised tokens in ``[start, end)`` (absolute prompt positions).

        Loads are synchronous, so nothing was copied yet: the promise is cut to the part still consumed (a head or a
        tail of it). A cut that would leave a hole, or nothing, drops the promise.
        """
        request_id = _request_id(request)
        try:
            promise = self._promises.get(request_id)
            if promise is None or end <= start:
                return
            load = promise.load
            lo, hi = load.start, load.start + load.tokens
            if end <= lo or start >= hi:
                return
            keep = (lo, start) if start > lo and end >= hi else (end, hi) if start <= lo and end < hi else None
            if keep is None:
                # The runtime computes the whole range itself: nothing of ours lands, so nothing is tainted.
                self._drop_promise(
                    request_id, DeclineReason.LOAD_CANCELLED, f"cancel_load({start}, {end})", taint=False
                )
                return
            promise.load = trim_load(load, *keep)
            kept = {seg.donor.donor_id for seg in promise.load.segments}
            for donor_id in promise.donor_ids:
                if donor_id not in kept:
                    self.registry.unlease(donor_id)
            promise.donor_ids = tuple(d for d in promise.donor_ids if d in kept)
            self._stats.count("cancelled", DeclineReason.LOAD_CANCELLED.value)
        except Exception as exc:
            logger.exception("semblend connector: cancel_load failed for request %s", request_id)
            self._drop_promise(request_id, DeclineReason.INTERNAL_ERROR, f"cancel_load: {type(exc).__name__}: {exc}")

    def update_state_after_alloc_by_layer_group(self, request: Any, block_ids_by_layer_group: list[list[int]]) -> None:
        """1.3+ with per-layer-group page indices: one group is the flat case; more cannot be served."""
        if len(block_ids_by_layer_group) == 1:
            self.update_state_after_alloc(request, list(block_ids_by_layer_group[0]))
            return
        self._drop_promise(
            _request_id(request),
            DeclineReason.LAYER_GROUPS_UNSUPPORTED,
            f"{len(block_ids_by_layer_group)} KV layer groups",
        )

    def request_finished_by_layer_group(self, request: Any, cache_block_ids_by_layer_group: list[list[int]]) -> bool:
        """1.3+ with per-layer-group page indices: one group is the flat case; with more nothing is pinned."""
        groups = cache_block_ids_by_layer_group
        return self.request_finished(request, list(groups[0]) if len(groups) == 1 else [])

    def evict_donor(self, donor_id: str) -> bool:
        """Release a donor now (operator action, tests, replay); a leased donor is kept. Returns whether released."""
        donor = self.registry.evict(donor_id)
        if donor is not None:
            self._released(donor, DeclineReason.DONOR_EVICTED)
        return donor is not None

    # --- decisions -------------------------------------------------------------------------------
    def _decide(self, request: Any, num_computed: int, started: float) -> int:
        request_id = _request_id(request)
        self._device_matched[request_id] = num_computed
        # One conversion of the token list (in C when trtllm_connector.unbox is built): the u32 array is both the
        # request key's input and the prompt every lookup (the span aligner's too) compares with the donors' u32 arrays.
        prompt_u32 = self._prompts[request_id] = u32_prompt(read_prompt(request))
        key = request_key(prompt_u32)
        prompt = np.frombuffer(prompt_u32, _U32)
        hint = self.hints.take(key)
        tenancy = self._tenancy[request_id] = read_tenancy(request)
        device_lineage = self._lineage[request_id] = self.policy.device_prefix_lineage(tenancy, num_computed)
        role = Role(hint.role).value if hint else _RECIPIENT
        trace_id = (hint.trace_id if hint else None) or new_trace_id()
        self._tags[request_id] = {"role": role, "trace_id": trace_id}
        if role == _DONOR_PREFILL:  # a donor holds the KV a cold prefill gives: it never loads
            return 0
        if hint is not None and hint.role == _CHAIN_STEP and not hint.spans:  # a chain step of own words
            return 0
        refused = self.policy.may_seek(tenancy)
        tenant = tenancy.tenant
        if refused is not None or tenant is None:
            return self._decline(request_id, refused or DeclineReason.TENANT_UNKNOWN, started, key=key)
        namespace = self._namespace_digest(read_lora(request), tenant)
        candidates = self._hint_candidates(hint, namespace)
        similarity = hint.similarity if hint else None
        if isinstance(candidates, DeclineReason):
            self._lookup(
                request_id,
                role,
                trace_id,
                found=False,
                namespace=namespace,
                donor_id=hint.donor_id if hint else None,
                similarity=similarity,
            )
            return self._decline(request_id, candidates, started, namespace=namespace, key=key)
        spans, checked = self._find_spans(hint, candidates, namespace, prompt)
        decision = self.planner.plan(
            len(prompt),
            spans,
            similarity=similarity,
            device_prefix_tokens=num_computed,
            approximate_donors=self._approximate_donors(spans),
            chain_head_tokens=hint.chain_head_tokens if hint else None,
        )
        if hint is not None and not decision.accepted:  # the hinted donor alone falls short: search every donor
            local, local_checked = self._find_spans(None, None, namespace, prompt)
            retry = self.planner.plan(
                len(prompt),
                local,
                similarity=similarity,
                device_prefix_tokens=num_computed,
                approximate_donors=self._approximate_donors(local),
            )
            if retry.accepted:
                spans, checked, decision = local, local_checked, retry
        donor_id = spans[0].donor_id if spans else None
        self._lookup(
            request_id, role, trace_id, found=bool(spans), namespace=namespace, donor_id=donor_id, similarity=similarity
        )
        if decision.plan is None or decision.reason is not None:
            reason = decision.reason or DeclineReason.INTERNAL_ERROR
            return self._decline(request_id, reason, started, namespace=namespace, key=key, detail=decision.detail)
        try:
            load = validate_load(
                prompt,
                num_computed,
                decision.plan.spans,
                self.registry,
                namespace_digest=namespace,
                tokens_per_block=self.tokens_per_block,
                exact_only=self.cfg.exact_materialization_only,
                shift_supported=self.model.shift_supported,
                tokens_checked=checked,
            )
            self._check_backend(load, tenancy)
        except Declined as d:
            return self._decline(request_id, d.reason, started, namespace=namespace, key=key, detail=d.detail)
        # Every request of a prefill chain holds approximate KV (its loads sit after the recipient's own words).
        in_chain = hint is not None and hint.chain_head_tokens is not None
        lineage = self._lineage[request_id] = Lineage.of(
            device_lineage is Lineage.APPROXIMATE, load.lineage is Lineage.APPROXIMATE, in_chain
        )
        donors = {s.donor.donor_id: s.donor for s in load.segments}
        donor_ids = tuple(donors)
        self._promises[request_id] = _Promise(load, key, namespace, started, lineage, donor_ids=donor_ids)
        for donor in donors.values():  # one lease per donor, returned once in build_connector_meta
            self.registry.lease(donor)
        stats = self._stats
        stats.promised += 1
        stats.promised_tokens += load.tokens
        record = AuditRecord(
            event=AuditEvent.PROMISED,
            role=role,
            trace_id=trace_id,
            request_id=str(request_id),
            num_new_matched_tokens=load.tokens,
            donor_id=",".join(donor_ids),
            worker_id=self._worker_id,
            namespace=namespace,
            tokens=load.tokens,
            blocks=load.tokens // self.tokens_per_block,
            delta=load.segments[0].delta,
            requires_rope_correction=load.lineage.rope_corrected(load.requires_rope_correction),
            lineage=_LINEAGE_VALUES[load.lineage],
            mode=self.cfg.mode,
            latency_us=(time.perf_counter() - started) * 1e6,
        )
        self.audit.write(record)
        return load.tokens

    def _find_spans(
        self, hint: DonorHint | None, candidates: list[str] | None, namespace: str, prompt: np.ndarray
    ) -> tuple[list[Span], bool]:
        """Token-exact spans between the u32 prompt and pinned donors, found locally (a hint only narrows the search).

        A hint's spans are re-checked token by token against the donor; exact mode looks only for the longest shared
        prefix (the only exact-equivalent KV); shifted mode runs the span aligner (on the same u32 arrays: the
        registry's donor copies). The flag: the spans were compared with the registry's own donor arrays here
        (``validate_load`` need not compare them again; the aligner's spans it does, while they are still in cache).
        """
        if hint is not None and hint.spans and candidates:
            donor = self.registry.get(candidates[0])
            runs = [s for s in (_exact_run(donor, prompt, *triple) for triple in hint.spans) if s] if donor else []
            return runs, True
        if self.cfg.exact_materialization_only:
            donor_id, length = self.registry.longest_prefix(namespace, prompt)
            if candidates is not None and donor_id not in candidates:
                return self._align(namespace, prompt, candidates), False
            spans = [Span(donor_id=donor_id, donor_start=0, target_start=0, length=length)] if length else []
            return spans, True
        return self._align(namespace, prompt, candidates), False

    def _align(self, namespace: str, prompt: np.ndarray, candidates: list[str] | None) -> list[Span]:
        return self.aligner.align(namespace, prompt, candidates=candidates, max_spans=self.cfg.max_spans)

    def _approximate_donors(self, spans: list[Span]) -> set[str] | tuple[()]:
        """The spans' donors whose own KV is approximate (an empty tuple for none: no set made on every decision)."""
        out: set[str] | tuple[()] = ()
        get = self.registry.get
        for span in spans:
            donor = get(span.donor_id)
            if donor is not None and donor.lineage is Lineage.APPROXIMATE:
                out = {*out, span.donor_id}
        return out

    def _namespace_digest(self, lora: str, tenant: str) -> str:
        digest = self._digests.get((lora, tenant))
        if digest is None:
            digest = self._digests[(lora, tenant)] = self.model.namespace(lora=lora, tenant=tenant).digest()
        return digest

    def _hint_candidates(self, hint: DonorHint | None, namespace: str) -> list[str] | DeclineReason | None:
        """The donors a hint allows (None: no hint, search every pinned donor), or why the hint is unusable."""
        if hint is None:
            return None
        if hint.namespace != namespace or hint.worker_id != self.cfg.worker_id:
            return DeclineReason.NAMESPACE_MISMATCH
        # The router names a donor by its own id and by its prompt's request key (donor_key); ours differ.
        donor = self.registry.get(hint.donor_id) or (self.registry.by_key(hint.donor_key) if hint.donor_key else None)
        if donor is None:
            return self.registry.why_gone(hint.donor_id)
        if donor.namespace_digest != namespace:
            return DeclineReason.NAMESPACE_MISMATCH
        return [donor.donor_id]

    def _check_backend(self, load: ValidatedLoad, tenancy: Tenancy) -> None:
        """What the worker, the cache and the donor policy need for this load, checked before the promise."""
        pool = self.state.pool_state()
        groups = max(self.model.layer_groups, pool.layer_groups if pool else 1)
        if groups > 1:
            raise Declined(DeclineReason.LAYER_GROUPS_UNSUPPORTED, f"{groups} KV layer groups (sliding-window layers)")
        if pool is None:
            raise Declined(DeclineReason.UNSUPPORTED_LAYOUT, "the worker has not registered the KV pool")
        if load.requires_rope_correction and self.model.kv_scale_missing:
            raise Declined(DeclineReason.KV_SCALE_UNKNOWN, "fp8 KV without SEMBLEND_KV_SCALE: exact loads only")
        tpb = self.tokens_per_block
        needs_geometry = False
        for s in load.segments:
            if s.target_start != s.donor_start or s.donor_start % tpb or s.length % tpb:
                needs_geometry = True
                break
        if needs_geometry and not pool.geometry_ok:
            raise Declined(DeclineReason.UNSUPPORTED_LAYOUT, "pool geometry unknown: only whole-block copies possible")
        refused = self.policy.may_load(tenancy, load.lineage)
        if refused is DeclineReason.ISOLATION_REQUIRED:
            raise Declined(refused, "approximate KV needs a per-request cache salt tenant|nonce")
        if refused is not None:
            raise Declined(refused, f"{load.lineage.value} load")

    def _check_block_hashes(self, request_id: int, promise: _Promise) -> None:
        """1.3+: the engine's hash of each exactly loaded block must equal the donor's (raises :class:`Declined`).

        Our identity of an exact block is (namespace, the tokens up to it); the engine's is its block hash, which also
        covers what we cannot see (multimodal keys, extra token ids). Compared only where both chains are known and
        both requests carry the same salt string (the salt is part of the chain).
        """
        target = self._engine_blocks.get(request_id)
        if target is None:
            return
        target_hashes, salt = target
        tpb = self.tokens_per_block
        for seg in promise.load.segments:
            donor = seg.donor
            if not seg.exact_equivalent or not donor.block_hashes or donor.cache_salt != salt:
                continue
            last = min((seg.target_start + seg.length) // tpb, len(donor.block_hashes), len(target_hashes))
            for j in range(seg.target_start // tpb, last):
                if donor.block_hashes[j] != target_hashes[j]:
                    raise Declined(
                        DeclineReason.BLOCK_HASH_MISMATCH, f"block {j}: the engine's hash differs from {donor.donor_id}"
                    )

    def _plan(self, request_id: int, promise: _Promise, new_block_ids: list[int] | None) -> LoadPlan:
        """The plan rows for a promise, after revalidating every donor (raises :class:`Declined`)."""
        tpb = self.tokens_per_block
        target_blocks = promise.block_ids or []
        load = promise.load
        last_block = (load.start + load.tokens) // tpb
        if len(target_blocks) < last_block:
            raise Declined(DeclineReason.INTERNAL_ERROR, f"{len(target_blocks)} blocks allocated, {last_block} needed")
        dst = target_blocks[load.start // tpb : last_block]
        if new_block_ids is not None and not set(dst) <= set(new_block_ids):
            raise Declined(DeclineReason.INTERNAL_ERROR, "scheduler output disagrees on the target's blocks")
        rows: list[tuple[int, int, int, int, int, int]] = []
        for seg in load.segments:
            donor = self.registry.get(seg.donor.donor_id)
            if donor is None:
                raise Declined(self.registry.why_gone(seg.donor.donor_id), seg.donor.donor_id)
            if donor.generation != seg.generation:
                raise Declined(DeclineReason.GENERATION_MISMATCH, donor.donor_id)
            if set(dst) & set(donor.block_ids):
                raise Declined(DeclineReason.INTERNAL_ERROR, f"target blocks overlap donor {donor.donor_id}")
            span = CopySpan(seg.donor_start, seg.target_start, seg.length)
            rows.extend(
                tuple(r) for r in split_spans_to_plan([span], list(donor.block_ids), target_blocks, tpb).tolist()
            )
            self.registry.touch(donor)
        return LoadPlan(
            request_id=request_id,
            request_key=promise.request_key,
            donor_ids=promise.donor_ids,
            rows=tuple(rows),  # type: ignore[arg-type]
            tokens=load.tokens,
            blocks=load.tokens // tpb,
            delta=load.segments[0].delta,
            requires_rope_correction=load.requires_rope_correction,
            lineage=load.lineage.value,
            namespace=promise.namespace,
            mode=self.cfg.mode,
            promised_at=promise.promised_at,
            role=self._tags.get(request_id, {}).get("role", Role.RECIPIENT.value),
            trace_id=self._tags.get(request_id, {}).get("trace_id"),
        )

    def _admit_donor(
        self,
        request: Any,
        request_id: int,
        block_ids: list[int],
        tenancy: Tenancy,
        lineage: Lineage,
        engine_blocks: tuple[list[int], str | None] | None,
        decided_prompt: array.array[int] | None,
    ) -> bool:
        """Pin the finished request as a donor if policy and budget allow.

        Its tokens are the prompt read when it was decided on (the tokens its KV was computed for; TensorRT-LLM's
        prompt does not change), so the prompt is not read and unboxed a second time; a request never decided on,
        or whose ``prompt_len`` disagrees, is read again.
        """
        if self.state.pop_taint(request_id):  # promised KV that was never loaded: wrong content
            metrics.DONORS.labels("tainted").inc()
            return False
        if not self.cfg.enabled:
            return False
        refused = self.policy.may_give(tenancy, lineage)
        if refused is not None or tenancy.tenant is None:
            metrics.DONORS.labels((refused or DeclineReason.TENANT_UNKNOWN).value).inc()
            return False
        prompt_len = getattr(request, "prompt_len", None)
        prompt: Sequence[int]
        if decided_prompt is not None and isinstance(prompt_len, int) and len(decided_prompt) == prompt_len:
            prompt = decided_prompt
        else:
            prompt = u32_prompt(read_prompt(request))
        tpb = self.tokens_per_block
        if len(prompt) < self.cfg.min_donor_tokens or -(-len(prompt) // tpb) > len(block_ids):
            return False
        if min(block_ids, default=0) < 0:  # a block without a page holds no KV
            return False
        pool = self.state.pool_state()
        self.registry.budget_blocks = int(pool.num_blocks * self.cfg.pin_budget_fraction) if pool else 0
        namespace = self.model.namespace(lora=read_lora(request), tenant=tenancy.tenant)
        hashes, salt = engine_blocks if engine_blocks is not None else ((), None)
        result = self.registry.admit(
            request_id, namespace, prompt, block_ids, lineage, block_hashes=hashes, cache_salt=salt
        )
        for donor in result.released:
            self._released(donor, self.registry.why_gone(donor.donor_id))
        metrics.PINNED_BLOCKS.set(self.registry.held_blocks)
        if result.donor is None:
            metrics.DONORS.labels("refused").inc()
            return False
        donor = result.donor
        self.aligner.add_donor(donor.donor_id, donor.namespace_digest, donor.tokens)  # type: ignore[arg-type]
        metrics.DONORS.labels("pinned").inc()
        self.audit.write(
            event=AuditEvent.DONOR_REGISTERED,
            **self._tags.get(request_id, {}),
            request_id=str(request_id),
            donor_id=donor.donor_id,
            worker_id=self._worker_id,
            namespace=donor.namespace_digest,
            tokens=len(donor.tokens),
            blocks=donor.num_blocks,
            lineage=donor.lineage.value,
        )
        if self.link is not None:
            self.link.lifecycle(donor, "pinned")
        return True

    # --- bookkeeping -----------------------------------------------------------------------------
    def _released(self, donor: Donor, reason: DeclineReason) -> None:
        self.aligner.remove_donor(donor.donor_id)
        metrics.DONORS.labels(reason.value).inc()
        self.audit.write(
            event=AuditEvent.DONOR_RELEASED,
            **self._tags.pop(donor.request_id, {}),
            request_id=str(donor.request_id),
            donor_id=donor.donor_id,
            worker_id=self._worker_id,
            namespace=donor.namespace_digest,
            blocks=donor.num_blocks,
            detail=reason.value,
        )
        if self.link is not None:
            self.link.lifecycle(donor, "released" if reason == DeclineReason.DONOR_LEASE_EXPIRED else "evicted")

    def _drop_promise(self, request_id: int, reason: DeclineReason, detail: str, *, taint: bool = True) -> None:
        promise = self._promises.pop(request_id, None)
        if promise is None:
            return
        if taint:
            self.state.taint(request_id)
        for donor_id in promise.donor_ids:
            self.registry.unlease(donor_id)
        self._decline(
            request_id, reason, promise.promised_at, key=promise.request_key, detail=f"after promise: {detail}"
        )

    def _tag(self, request_id: int | None) -> tuple[str | None, str | None]:
        """A request's audit ``role`` and ``trace_id`` (records are built directly: no keyword dict to unpack)."""
        tags = self._tags.get(request_id) if request_id is not None else None
        return (tags["role"], tags["trace_id"]) if tags else (None, None)

    def _lookup(
        self,
        request_id: int,
        role: str,
        trace_id: str,
        *,
        found: bool,
        namespace: str,
        donor_id: str | None,
        similarity: float | None,
    ) -> None:
        """Audit the lookup (``role`` and ``trace_id``: the decision's own, not looked up again in its tags); its line
        goes to disk with the verdict's record, which always follows (one write)."""
        record = AuditRecord(
            event=AuditEvent.LOOKUP,
            role=role,
            trace_id=trace_id,
            request_id=str(request_id),
            similarity=similarity,
            worker_id=self._worker_id,
            namespace=namespace,
            found=found,
            donor_id=donor_id,
            mode=self.cfg.mode,
        )
        self.audit.write(record, flush=False)

    def _decline(
        self,
        request_id: int | None,
        reason: DeclineReason,
        started: float,
        *,
        namespace: str | None = None,
        key: str | None = None,
        detail: str = "",
    ) -> int:
        self._stats.count("declined", reason.value)
        role, trace_id = self._tag(request_id)
        record = AuditRecord(
            event=AuditEvent.DECLINED,
            role=role,
            trace_id=trace_id,
            outcome=Outcome.BACKEND_DECLINED,
            request_id=None if request_id is None else str(request_id),
            worker_id=self._worker_id,
            namespace=namespace,
            rejection_reason=reason,
            requires_rope_correction=False,
            mode=self.cfg.mode,
            latency_us=max(0.0, (time.perf_counter() - started) * 1e6),
            detail=detail or None,
        )
        self.audit.write(record)
        if self.link is not None and request_id is not None and key:
            self.link.outcome(str(request_id), namespace or "", Outcome.BACKEND_DECLINED, reason=reason, key=key)
        return 0


def _exact_run(donor: Donor, prompt: np.ndarray, donor_start: int, target_start: int, length: int) -> Span | None:
    """The token-exact run from a hinted span's start (the hinted length is advisory: the run may be longer)."""
    if donor_start >= len(donor.tokens) or target_start >= len(prompt):
        return None
    run = shared_prefix(donor.tokens[donor_start:], prompt[target_start:])
    return (
        Span(donor_id=donor.donor_id, donor_start=donor_start, target_start=target_start, length=run) if run else None
    )


def engine_block_reuse(llm_args: Any) -> bool:
    """Whether the engine keeps finished blocks for prefix reuse (TensorRT-LLM's default: yes)."""
    value = getattr(getattr(llm_args, "kv_cache_config", None), "enable_block_reuse", None)
    return True if value is None else bool(value)


def _request_id(request: Any) -> int:
    return int(request.request_id)
