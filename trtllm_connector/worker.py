"""The worker half of SemBlend's TensorRT-LLM connector (every rank): copies donor KV into the target's new blocks
and reports donor releases.

Per iteration, in PyExecutor's order: ``start_load_kv(stream)`` enqueues each planned copy on the forward stream,
rotating K by the position delta (Triton on the GPU, the torch reference on CPU pools); ``wait_for_save`` confirms
completion (a CUDA event) before auditing ``materialized``; ``get_finished`` reports donor releases, each only after
its id was passed in.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import torch
from semblend_kernels.layout import FP8_KV_DTYPE, PagedKVLayout
from semblend_kernels.rope_delta import rope_delta_copy, rope_delta_copy_reference

from semblend_dynamo.audit import AuditEvent, AuditWriter, Role, audit_file
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.policy import Lineage

from . import metrics
from .base import KvCacheConnectorWorker
from .engine_state import EngineState, PoolState
from .metadata import ConnectorMetadata, LoadPlan
from .model_info import ModelInfo

logger = logging.getLogger(__name__)


class SemBlendConnectorWorker(KvCacheConnectorWorker):
    """The worker half (every rank): copies donor KV into target blocks and reports donor releases."""

    supports_attention_dp = False  # see SemBlendConnectorScheduler

    def __init__(
        self,
        llm_args: Any,
        *,
        config: SemblendConfig | None = None,
        audit: AuditWriter | None = None,
        rank: int | None = None,
    ) -> None:
        """Built by TensorRT-LLM with ``llm_args`` only; the keyword arguments are for the harness and tests."""
        super().__init__(llm_args)
        cfg = config if config is not None else SemblendConfig.load()
        self.cfg = cfg
        self.model = ModelInfo.load(cfg, llm_args)
        self.rank = _mpi_rank() if rank is None else rank
        self.state = EngineState.of(llm_args)
        self.audit = audit if audit is not None else self.state.audit(audit_file(cfg))
        self.pool: torch.Tensor | None = None
        self.layout: PagedKVLayout | None = None
        self._inv_freq: torch.Tensor | None = None
        self._kv_scale: torch.Tensor | None = None  # fp8: dequantization scale on the pool's device
        self._saving: set[int] = set()  # ids passed in finished_gen_req_ids, not yet reported
        self._releases_due: set[int] = set()
        self._launched: list[tuple[LoadPlan, Any]] = []

    def register_kv_cache_layout(self, layout: Any) -> None:
        """1.3+ (KV cache manager V2): one layer group is one pool tensor; more are declined, never registered."""
        groups = len(getattr(layout, "groups", ()) or ())
        tensor = layout.as_single_pool_tensor() if groups <= 1 else None
        if tensor is None:
            logger.warning("semblend connector: %d KV layer groups; every load will be declined", groups)
            self.state.publish_pool(
                PoolState(num_blocks=0, num_layers=0, geometry_ok=False, layer_groups=max(groups, 2))
            )
            return
        self.register_kv_caches(tensor)

    def register_kv_caches(self, kv_cache_tensor: torch.Tensor) -> None:
        """Called once with the primary pool ``[num_blocks, num_layers, 2, tokens_per_block*kv_heads*head_dim]``."""
        m = self.model
        if m.fp8 and kv_cache_tensor.dtype in (torch.uint8, torch.int8):  # fp8 codes handed over as raw bytes
            kv_cache_tensor = kv_cache_tensor.view(FP8_KV_DTYPE)
        self.pool = kv_cache_tensor
        nb, nl = int(kv_cache_tensor.shape[0]), int(kv_cache_tensor.shape[1])
        geometry_ok = False
        if kv_cache_tensor.dtype == FP8_KV_DTYPE and m.kv_scale is not None:
            self._kv_scale = torch.tensor(m.kv_scale, dtype=torch.float32, device=kv_cache_tensor.device)
        if m.num_kv_heads and m.head_dim:
            try:
                layout = PagedKVLayout(nl, m.num_kv_heads, m.head_dim, m.tokens_per_block, m.layout_order)  # type: ignore[arg-type]
                layout.check_pool(kv_cache_tensor, self._byte_copy_scale(kv_cache_tensor))
                self.layout = layout
                geometry_ok = True
            except ValueError as exc:
                logger.warning(
                    "semblend connector: KV pool does not match the model config (%s); exact block copies only", exc
                )
        if m.inv_freq is not None:
            self._inv_freq = torch.tensor(m.inv_freq, dtype=torch.float32, device=kv_cache_tensor.device)
        self.state.publish_pool(PoolState(num_blocks=nb, num_layers=nl, geometry_ok=geometry_ok))

    def start_load_kv(self, stream: Any) -> None:
        """Called before the forward pass with the forward stream: enqueue every planned copy on it."""
        meta = self.get_connector_meta()
        if not isinstance(meta, ConnectorMetadata):
            return
        self._releases_due.update(meta.releases)
        for plan in meta.loads:
            try:
                event = self._copy(plan, stream)
            except Exception as exc:
                logger.exception("semblend connector: load for request %s failed", plan.request_id)
                self._report_failure(plan, exc)
                continue
            self._launched.append((plan, event))

    def wait_for_layer_load(self, layer_idx: int, stream: Any) -> None:
        """Forward pre-hook per decoder layer: nothing to wait for (loads are enqueued before the forward)."""

    def save_kv_layer(self, layer_idx: int, stream: Any) -> None:
        """Forward post-hook per decoder layer: SemBlend saves nothing (donors stay in place, pinned)."""

    def wait_for_save(self, stream: Any) -> None:
        """Called after the forward pass: confirm the copies finished, then audit them as materialized."""
        launched, self._launched = self._launched, []
        for plan, event in launched:
            try:
                if event is not None:
                    event.synchronize()
            except Exception as exc:
                self._report_failure(plan, exc)
                continue
            metrics.MATERIALIZED_TOKENS.labels(plan.lineage).inc(plan.tokens)
            if self.rank == 0:
                chain_step = plan.role == Role.CHAIN_STEP.value
                self.audit.write(
                    event=AuditEvent.CHAIN_STEP_LOADED if chain_step else AuditEvent.MATERIALIZED,
                    role=plan.role,
                    trace_id=plan.trace_id,
                    outcome=Outcome.BACKEND_MATERIALIZED,
                    request_id=str(plan.request_id),
                    donor_id=",".join(plan.donor_ids),
                    worker_id=str(self.cfg.worker_id),
                    namespace=plan.namespace,
                    materialized=plan.tokens,
                    tokens=plan.tokens,
                    blocks=plan.blocks,
                    delta=plan.delta,
                    requires_rope_correction=Lineage(plan.lineage).rope_corrected(plan.requires_rope_correction),
                    lineage=plan.lineage,
                    mode=plan.mode,
                    latency_us=(time.perf_counter() - plan.promised_at) * 1e6,
                )
                link = self.state.outcome_link() if self.cfg.connector_nats else None  # the rank-0 scheduler's
                if link is not None:
                    link.outcome(
                        str(plan.request_id),
                        plan.namespace,
                        Outcome.BACKEND_MATERIALIZED,
                        tokens=plan.tokens,
                        donor_id=plan.donor_ids[0],
                        key=plan.request_key,
                    )

    def get_finished(
        self, finished_gen_req_ids: list[int], started_loading_req_ids: list[int]
    ) -> tuple[list[int], list[int]]:
        """Called at the end of every iteration: donors whose release is due and whose id was already passed in."""
        self._saving.update(finished_gen_req_ids)
        done = sorted(self._releases_due & self._saving)
        self._releases_due.difference_update(done)
        self._saving.difference_update(done)
        return done, []

    # --- internals -------------------------------------------------------------------------------
    def _copy(self, plan: LoadPlan, stream: Any) -> Any:
        pool = self.pool
        if pool is None:
            raise RuntimeError("start_load_kv before register_kv_caches")
        rows = torch.tensor(plan.rows, dtype=torch.int64)
        on_cuda = pool.is_cuda and isinstance(stream, torch.cuda.Stream)
        ctx = torch.cuda.stream(stream) if on_cuda else contextlib.nullcontext()
        with ctx:
            # On CPU pools (the harness) whole unshifted blocks take a plain block copy. On the GPU every load goes
            # through the Triton kernel: its delta-0 path is a single-pass copy, where index_select + index_copy_
            # made a temporary and ran at a quarter of the bandwidth (benchmarks/bench_connector_worker.py).
            # (A plain block copy also serves whole-block loads when the head geometry is unknown.)
            block_copy = not pool.is_cuda or self.layout is None
            if block_copy and plan.is_whole_block_copy(self.model.tokens_per_block):
                src = rows[:, 0].to(pool.device)
                dst = rows[:, 2].to(pool.device)
                if bool(torch.isin(dst, src).any()):
                    raise ValueError("copy source and target blocks overlap")
                raw = pool.view(torch.uint8) if pool.element_size() == 1 else pool  # fp8: bytes (no CPU fp8 index_copy)
                raw.index_copy_(0, dst, raw.index_select(0, src))
            else:
                if self.layout is None:
                    raise RuntimeError("pool geometry unknown for a non-whole-block load")
                inv_freq = self._inv_freq
                if inv_freq is None or self.model.rotary_dim is None:
                    if plan.requires_rope_correction:
                        raise RuntimeError("RoPE config unknown for a shifted load")
                    inv_freq = torch.ones(1, dtype=torch.float32)
                rotary_dim = self.model.rotary_dim or 2
                style = "gptj" if self.model.rope_style == "gptj" else "neox"
                # Triton on the GPU (its host-side plan check refuses overlapping reads and writes); on CPU pools
                # the torch reference, which is the kernel's oracle.
                copy = rope_delta_copy if pool.is_cuda else rope_delta_copy_reference
                kv_scale = self._kv_scale
                if kv_scale is None and pool.dtype == FP8_KV_DTYPE:
                    if plan.requires_rope_correction:
                        raise RuntimeError("fp8 KV scale unknown for a shifted load")
                    kv_scale = self._byte_copy_scale(pool)
                copy(pool, rows, inv_freq, self.layout, rotary_dim=rotary_dim, style=style, kv_scale=kv_scale)
            if on_cuda:
                event = torch.cuda.Event()
                event.record(stream)
                return event
        return None

    def _byte_copy_scale(self, pool: torch.Tensor) -> torch.Tensor | None:
        """The scale handed to the kernels: the known one, or for an fp8 pool without one a placeholder 1.0.

        The placeholder is safe only for delta-0 rows, which the kernels copy byte for byte without converting;
        shifted loads are declined (``kv_scale_unknown``) before they are promised, and refused here.
        """
        if pool.dtype != FP8_KV_DTYPE:
            return None
        if self._kv_scale is not None:
            return self._kv_scale
        return torch.ones(1, dtype=torch.float32, device=pool.device)

    def _report_failure(self, plan: LoadPlan, exc: BaseException) -> None:
        self.state.taint(plan.request_id)
        if self.rank != 0:
            return
        self.audit.write(
            event=AuditEvent.DECLINED,
            role=plan.role,
            trace_id=plan.trace_id,
            outcome=Outcome.BACKEND_DECLINED,
            request_id=str(plan.request_id),
            donor_id=",".join(plan.donor_ids),
            worker_id=str(self.cfg.worker_id),
            namespace=plan.namespace,
            rejection_reason=DeclineReason.INTERNAL_ERROR,
            requires_rope_correction=plan.requires_rope_correction,
            mode=plan.mode,
            detail=f"after promise: load failed: {type(exc).__name__}: {exc}",
        )


def _mpi_rank() -> int:
    try:
        from tensorrt_llm._utils import mpi_rank  # type: ignore[import-not-found]
    except ImportError:
        return 0
    return int(mpi_rank())
