"""The reference engine: a Hugging Face ``transformers`` causal LM in TensorRT-LLM's place around the real connector.

What it is: the SemBlend connector (:class:`trtllm_connector.connector.SemBlendConnectorScheduler` and
``SemBlendConnectorWorker``, unchanged) driven in PyExecutor's call order by
:class:`trtllm_connector.harness.PyExecutorHarness`, over a real paged KV pool in TensorRT-LLM's layout. This module
supplies the harness's "model" (:class:`HFKvWriter`): for every prefill it gathers the tokens already in the
request's blocks (device prefix or donor KV the connector materialized, with the Triton RoPE-delta kernel) into a
preallocated KV arena (:class:`~semblend_apps.reference_engine.prefill_runner.KVArena`), runs the model on the remaining
tokens only, writing their K/V in place after the prefix, and scatters the new post-RoPE K and V into the pool, as
TensorRT-LLM's attention kernel would. With ``cuda_graphs=True`` the model's forward is replayed from a CUDA graph
(:class:`~semblend_apps.reference_engine.prefill_runner.PrefillRunner`); the cold baseline then uses graphs too.

What it is not: TensorRT-LLM. There is no paged attention (the prefix is gathered into a contiguous arena, a cost
reported separately as ``readback``), no batching, no chunked prefill and no tensor parallelism; the model runs
Hugging Face's modules with SDPA attention and no kernel fusion. The connector, the planner, the validation and the
kernels are the production code; the timing of the model part is Hugging Face's, not TensorRT-LLM's.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from semblend_kernels.layout import PagedKVLayout

from semblend_apps.reference_engine.hf_model import KVGeometry
from semblend_apps.reference_engine.kv_pool import read_prefix, write_range
from semblend_apps.reference_engine.prefill_runner import PrefillRunner
from semblend_dynamo.audit import AuditWriter
from semblend_dynamo.chain import ChainPlan
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.schemas import DonorHint, request_key
from semblend_dynamo.namespace import isolating_salt
from semblend_dynamo.outcomes import Outcome
from semblend_dynamo.router.prefill_chain import chain_hints
from trtllm_connector.connector import SemBlendConnectorScheduler, SemBlendConnectorWorker
from trtllm_connector.harness import HarnessLlmArgs, PyExecutorHarness
from trtllm_connector.hints import HintInbox


class StageClock:
    """Wall-clock seconds per named stage, CUDA-synchronized around each measured call when on a GPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.enabled = True
        """Off: stages run unsynchronized and untimed (whole-request timings without the clock's device syncs)."""
        self.seconds: dict[str, float] = defaultdict(float)

    def reset(self) -> None:
        self.seconds.clear()

    def timed(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped so that its time (after the device drained) is added to ``stage``."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return fn(*args, **kwargs)
            self._sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.seconds[stage] += time.perf_counter() - start

        return wrapper

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


@dataclass
class PrefillOutput:
    """What the model produced for the last prefill the harness ran."""

    logits: torch.Tensor
    """fp32 logits of the last ``keep`` positions."""
    cache: Any
    """A ``transformers`` cache over the request's K/V (prefix + computed tokens), valid until the next prefill."""
    start_pos: int
    """Tokens taken from the pool (device prefix + materialized) instead of computed."""


class HFKvWriter:
    """The harness's model (``trtllm_connector.harness.KvWriter``) backed by a ``transformers`` causal LM.

    ``write_kv`` is called once per prefill by the harness; ``keep`` (set by the caller before the request) is how
    many trailing positions' logits to keep. ``last`` holds the output of the latest prefill.
    """

    def __init__(self, runner: PrefillRunner, clock: StageClock) -> None:
        self.runner = runner
        self.clock = clock
        self.keep = 1
        self.last: PrefillOutput | None = None

    def write_kv(
        self, pool: torch.Tensor, layout: PagedKVLayout, block_ids: Sequence[int], tokens: Sequence[int], start_pos: int
    ) -> None:
        arena = self.runner.reserve(-(-len(tokens) // layout.tokens_per_block) * layout.tokens_per_block)
        if start_pos:
            self.clock.timed("readback", read_prefix)(pool, layout, block_ids, start_pos, arena.kv)
        logits = self.clock.timed("prefill", self.runner.prefill)(tokens, start_pos, self.keep)
        new = arena.kv[:, :, :, start_pos : len(tokens)]
        self.clock.timed("writeback", write_range)(pool, layout, block_ids, new, start_token=start_pos)
        self.last = PrefillOutput(logits=logits, cache=arena.cache(len(tokens)), start_pos=start_pos)


@dataclass
class RequestRun:
    """One request through the reference engine."""

    request_id: int
    prompt_tokens: int
    block_ids: list[int]
    device_matched: int
    promised: int
    materialized: int
    declined: dict[str, int]
    """Decline reasons audited while this request ran (empty when it materialized or found nothing to decline)."""
    logits: torch.Tensor
    cache: Any
    stages: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    """The whole request in the harness, scheduling to finish (CUDA-synchronized), donor bookkeeping included."""
    first_token_s: float = 0.0
    """Scheduling to the end of the prefill (CUDA-synchronized): the whole request's time to first token."""
    first_token_at: float = 0.0
    """``time.perf_counter()`` at the first token (chains time from their first step to the request's)."""

    @property
    def ttft_s(self) -> float:
        """Time to first token: connector decision and plan, worker copy, prefix readback, prefill of the rest.

        ``writeback`` (scattering new K/V into the pool) is left out: TensorRT-LLM's attention kernel writes the
        cache as it computes, so it has no such step.
        """
        return sum(v for k, v in self.stages.items() if k != "writeback")


class HFReferenceEngine:
    """A ``transformers`` model + the real SemBlend connector over one paged KV pool (see the module docstring)."""

    SCHEDULER_STAGES = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta")

    def __init__(
        self,
        model: Any,
        cfg: SemblendConfig,
        *,
        num_blocks: int,
        audit: AuditWriter | None = None,
        model_dir: str | None = None,
        cuda_graphs: bool = False,
        harness_checks: bool = True,
        prefix_reuse: bool = False,
    ) -> None:
        """Build the connector halves and the harness; the pool lives on the model's device, in its dtype.

        ``cuda_graphs`` replays the model's forward from CUDA graphs captured per shape (see ``prefill_runner``).
        ``harness_checks=False`` turns off the harness's own checks (which blocks the connector wrote, the metadata's
        pickle round trip) in timed runs.
        ``prefix_reuse`` is the engine's block reuse, keyed by cache salt (prefill chains need it).
        """
        param = next(model.parameters())
        geometry = KVGeometry.of(model.config)
        if cfg.rope_config is None:
            cfg = cfg.model_copy(update={"rope_config": model.config.to_json_string(use_diff=False)})
        self.cfg = cfg
        self.model = model
        self.audit = audit if audit is not None else AuditWriter(None)
        self.clock = StageClock(cuda=param.is_cuda)
        llm_args = HarnessLlmArgs(cfg.block_size, model=model_dir, enable_block_reuse=prefix_reuse)  # as the harness
        scheduler = SemBlendConnectorScheduler(llm_args, config=cfg, audit=self.audit, hints=HintInbox())
        worker = SemBlendConnectorWorker(llm_args, config=cfg, audit=self.audit, rank=0)
        for name in self.SCHEDULER_STAGES:
            setattr(scheduler, name, self.clock.timed("connector_scheduler", getattr(scheduler, name)))
        worker.start_load_kv = self.clock.timed("connector_worker", worker.start_load_kv)  # type: ignore[method-assign]
        layout = PagedKVLayout(geometry.num_layers, geometry.kv_heads, geometry.head_dim, cfg.block_size)
        self.runner = PrefillRunner(model, cuda_graphs=cuda_graphs)
        self.writer = HFKvWriter(self.runner, self.clock)
        self.harness = PyExecutorHarness(
            scheduler,
            worker,
            layout,
            num_blocks,
            self.writer,
            dtype=param.dtype,
            device=param.device,
            prefix_reuse=prefix_reuse,
        )
        self.harness.harness_checks = harness_checks
        self._cuda = param.is_cuda

    def run(self, prompt: Sequence[int], *, keep: int = 1, cache_salt: str | None = None) -> RequestRun:
        """Prefill ``prompt`` as one request (a donor candidate once finished); logits of the last ``keep`` positions."""
        self.writer.keep = keep
        self.clock.reset()
        materialized_before = self.audit.by_event["materialized"] + self.audit.by_event["chain_step_loaded"]
        reasons_before = dict(self.audit.by_reason)
        if self._cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        result = self.harness.run_request(list(prompt), cache_salt=cache_salt, capture_kv=False)
        if self._cuda:
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - started
        out = self.writer.last
        if out is None:
            raise RuntimeError("the harness ran no prefill")
        confirmed = self.audit.by_event["materialized"] + self.audit.by_event["chain_step_loaded"] > materialized_before
        return RequestRun(
            request_id=result.request_id,
            prompt_tokens=len(prompt),
            block_ids=result.block_ids,
            device_matched=result.device_matched,
            promised=result.promised,
            materialized=result.promised if confirmed else 0,
            declined={
                r: n - reasons_before.get(r, 0) for r, n in self.audit.by_reason.items() if n > reasons_before.get(r, 0)
            },
            logits=out.logits,
            cache=out.cache,
            stages=dict(self.clock.seconds),
            wall_s=wall_s,
            first_token_s=result.first_token_at - started,
            first_token_at=result.first_token_at,
        )

    def donor_id(self, run: RequestRun) -> str | None:
        """The connector's donor id of a finished request it pinned (None when it did not become a donor)."""
        registry = self.harness.scheduler.registry
        donor = registry.donor_id_for(run.request_id)
        return donor if registry.get(donor) is not None else None

    def run_chain(
        self,
        prompt: Sequence[int],
        plan: ChainPlan,
        donor_ids: Mapping[str, str],
        *,
        tenant: str,
        nonce: str,
        head_tokens: int | None = None,
    ) -> ChainRun:
        """``prompt`` as a prefill chain: each request of ``plan`` in order under one isolating salt, its load hinted.

        ``donor_ids`` maps the plan's span donor ids to the connector's; ``head_tokens`` is the plan's head recompute
        (default: the configured ``chain_head_tokens``). Every request finds the previous one in the
        engine's salted prefix cache; the connector loads the next span after it (see ``semblend_dynamo.chain``).
        """
        salt = isolating_salt(tenant, nonce)
        started = time.perf_counter()
        recipient = DonorHint(
            request_key=request_key(list(prompt)),
            request_id=nonce,
            donor_id=donor_ids[plan.loads[0].spans[0].donor_id],
            worker_id=self.cfg.worker_id,
            namespace=self.harness.scheduler.model.identity.namespace(tenant=tenant).digest(),
            decision=Outcome.SEMANTIC_PLACEMENT,
        )
        head = self.cfg.chain_head_tokens if head_tokens is None else head_tokens
        steps: list[RequestRun] = []
        for prompt_tokens, hint in chain_hints(plan, prompt, recipient, {}, head):
            self.harness.scheduler.hints.submit(hint.model_copy(update={"donor_id": donor_ids[hint.donor_id]}))
            steps.append(self.run(prompt[:prompt_tokens], cache_salt=salt))
        final = steps[-1]
        return ChainRun(steps=steps[:-1], final=final, first_token_s=final.first_token_at - started)

    @property
    def declines(self) -> dict[str, int]:
        """Decline counts by :class:`~semblend_dynamo.outcomes.DeclineReason` value, from the audit trail."""
        return dict(self.audit.by_reason)


@dataclass
class ChainRun:
    """A prefill chain through the reference engine: its prefill-only steps and the real request."""

    steps: list[RequestRun]
    final: RequestRun
    first_token_s: float
    """The first step's scheduling to the request's first token (CUDA-synchronized): the chain's whole TTFT."""

    @property
    def loaded(self) -> int:
        """Donor tokens every request of the chain loaded."""
        return sum(r.materialized for r in (*self.steps, self.final))


def cold_prefill(
    model: Any, prompt: Sequence[int], *, keep: int = 1, runner: PrefillRunner | None = None
) -> tuple[torch.Tensor, Any, float]:
    """A plain full prefill without connector or pool (the baseline): logits, cache, CUDA-synchronized seconds.

    Pass the engine's ``runner`` so the baseline runs the same forward (eager or CUDA graphs) as the engine.
    """
    runner = runner if runner is not None else PrefillRunner(model)
    clock = StageClock(cuda=next(model.parameters()).is_cuda)
    logits = clock.timed("prefill", runner.prefill)(prompt, 0, keep)
    return logits, runner.arena.cache(len(prompt)), clock.seconds["prefill"]
