"""Reuse modes a recipient can run under; each is one way of producing its warm prefill.

A mode takes the donor prompts and the recipient prompt (token ids) and returns the recipient's :class:`WarmRun`.
``exact`` and ``shifted`` run the reference engine (SmolLM2 through the SemBlend connector over a paged pool in
TensorRT-LLM's layout) with the connector in that mode. ``shifted`` runs with the deviation gate open
(``max_deviation=1``) and records the planner's input, so that one run shows both what the gate decides (the planner
is pure: :func:`gate` replays its input under the default settings) and what a declined case would have done. A
further mode is one more :class:`Mode` in :data:`MODES`. ``chain_h<N>`` runs the router-orchestrated prefill chain
(``semblend_dynamo.chain``) with a head recompute of ``N`` tokens, also with its gate open: the spans are aligned
against the donors, :func:`plan_chain` plans the steps, and the steps and the recipient run through the engine under
one isolating salt with its salted prefix cache, the connector loading each span; :func:`chain_gate` replays the
chain's default gate on the recorded spans.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from semblend_apps.reference_engine.hf_engine import HFReferenceEngine
from semblend_dynamo.chain import ChainDecision, ChainSettings, plan_chain
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.namespace import isolating_salt
from semblend_dynamo.planner import PlanDecision, Planner
from semblend_dynamo.span_aligner import Span, SpanAligner

BLOCK_SIZE = 32


@dataclass
class WarmRun:
    """The recipient's prefill under a mode: what was materialized, why not, and the model state after it."""

    materialized: int
    declined: dict[str, int]
    logits: torch.Tensor
    """fp32 logits of the prompt's last position (``[1, vocab]``)."""
    cache: Any
    """A ``transformers`` cache over the prompt's K/V, valid until the mode runs again."""
    decision: PlanDecision | None = None
    """The planner's last verdict on the recipient (None when it never planned, e.g. no donor found)."""
    plan_input: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    """The arguments of that verdict's ``Planner.plan`` call."""
    extra: dict[str, Any] = field(default_factory=dict)


class Mode(Protocol):
    name: str

    def run(self, model: Any, donors: Sequence[Sequence[int]], prompt: Sequence[int]) -> WarmRun: ...


def connector_config(mode: str, **overrides: Any) -> SemblendConfig:
    """The connector's settings for a mode: defaults, shifted spans on/off, and a pin budget that holds the donors.

    Shifted mode runs with ``isolation=no_block_reuse`` (the engine does no device prefix reuse), as the connector
    requires for approximate KV.
    """
    return SemblendConfig(
        block_size=BLOCK_SIZE,
        exact_materialization_only=mode == "exact",
        isolation="none" if mode == "exact" else "no_block_reuse",
        pin_budget_fraction=0.5,
        **overrides,
    )


@dataclass
class EngineMode:
    """Donors then the recipient through a fresh :class:`HFReferenceEngine` with ``config``."""

    name: str
    config: Callable[[], SemblendConfig]

    def run(self, model: Any, donors: Sequence[Sequence[int]], prompt: Sequence[int]) -> WarmRun:
        tokens = sum(len(d) for d in donors) + len(prompt)
        engine = HFReferenceEngine(model, self.config(), num_blocks=2 * (tokens // BLOCK_SIZE + 2 * len(donors) + 4))
        for donor in donors:
            engine.run(donor)
        calls: list[tuple[tuple[Any, ...], dict[str, Any], PlanDecision]] = []
        planner = engine.harness.scheduler.planner
        plan = planner.plan

        def recording(*args: Any, **kwargs: Any) -> PlanDecision:
            calls.append((args, kwargs, plan(*args, **kwargs)))
            return calls[-1][2]

        planner.plan = recording  # type: ignore[method-assign]
        warm = engine.run(prompt)
        chosen = next((c for c in calls if c[2].accepted), calls[-1] if calls else None)
        out = WarmRun(
            materialized=warm.materialized,
            declined=warm.declined,
            logits=warm.logits,
            cache=warm.cache,
            decision=chosen[2] if chosen else None,
            plan_input=(chosen[0], chosen[1]) if chosen else None,
        )
        del engine
        gc.collect()  # the stage-clock wrappers make reference cycles; the pool goes only with them
        return out


def gate(run: WarmRun, mode: str = "shifted") -> PlanDecision | None:
    """The default planner's verdict on the planner input ``run`` recorded (None when nothing was planned)."""
    if run.plan_input is None:
        return None
    args, kwargs = run.plan_input
    return Planner(connector_config(mode)).plan(*args, **kwargs)


CHAIN_TENANT = "quality"


@dataclass
class ChainMode:
    """The recipient as a prefill chain over its donors (gate open), ``head_tokens`` recomputed at each span's head.

    The engine reuses blocks within a cache salt (``isolation=cache_salt``). A chain the open planner still declines
    (no span past the head, nothing to load), or one without a step (a plain prefix load, which the plain planner
    judges), leaves the recipient cold: it runs in an engine without donors.
    """

    name: str
    head_tokens: int

    def config(self) -> SemblendConfig:
        return SemblendConfig(
            block_size=BLOCK_SIZE,
            exact_materialization_only=False,
            isolation="cache_salt",
            pin_budget_fraction=0.5,
            chain_enabled=True,
            chain_head_tokens=self.head_tokens,
            max_deviation=1.0,
        )

    def settings(self, cfg: SemblendConfig, *, deviation_gate: bool) -> ChainSettings:
        """The chain planner's settings with its cost model open (any chain that loads runs): quality, not speed.

        ``deviation_gate`` keeps the default ``chain_max_deviation``; without it the gate is open too.
        """
        return ChainSettings.from_config(cfg).model_copy(
            update={
                "step_overhead_tokens": 0,
                "min_speedup": 1.0,
                "max_steps": 64,
                "max_deviation": SemblendConfig().chain_max_deviation if deviation_gate else 1.0,
            }
        )

    def run(self, model: Any, donors: Sequence[Sequence[int]], prompt: Sequence[int]) -> WarmRun:
        cfg = self.config()
        tokens = sum(len(d) for d in donors) + 2 * len(prompt)
        blocks = 2 * (tokens // BLOCK_SIZE + 2 * len(donors) + 8)
        engine = HFReferenceEngine(model, cfg, num_blocks=blocks, prefix_reuse=True)
        aligner = SpanAligner(cfg.block_size, cfg.min_span_tokens)
        donor_ids: dict[str, str] = {}
        for i, donor in enumerate(donors):
            run = engine.run(donor, cache_salt=isolating_salt(CHAIN_TENANT, f"donor-{i}"))
            pinned = engine.donor_id(run)
            if pinned is not None:
                donor_ids[f"d{i}"] = pinned
                aligner.add_donor(f"d{i}", CHAIN_TENANT, donor)
        spans = aligner.align(CHAIN_TENANT, list(prompt))
        decision = plan_chain(len(prompt), spans, self.settings(cfg, deviation_gate=False))
        extra: dict[str, Any] = {"chain_head_tokens": self.head_tokens, "chain_spans": _span_rows(spans)}
        if decision.accepted and decision.plan is not None and decision.plan.steps:
            chain = engine.run_chain(prompt, decision.plan, donor_ids, tenant=CHAIN_TENANT, nonce="recipient")
            extra |= {
                "chain_steps": len(chain.steps),
                "chain_loaded": chain.loaded,
                "chain_planned": decision.plan.loaded_tokens,
                "estimated_deviation": decision.plan.estimated_deviation,
            }
            out = WarmRun(
                materialized=chain.loaded,
                declined=chain.final.declined,
                logits=chain.final.logits,
                cache=chain.final.cache,
            )
        else:
            del engine
            gc.collect()
            engine = HFReferenceEngine(model, cfg, num_blocks=blocks, prefix_reuse=True)
            cold = engine.run(prompt, cache_salt=isolating_salt(CHAIN_TENANT, "recipient"))
            reason = decision.reason.value if decision.reason is not None else "no_chain_step"
            out = WarmRun(materialized=0, declined={reason: 1}, logits=cold.logits, cache=cold.cache)
        out.extra = extra | {"gate": chain_gate(self, len(prompt), extra["chain_spans"])}
        del engine
        gc.collect()
        return out


def _span_rows(spans: Sequence[Span]) -> list[tuple[str, int, int, int]]:
    return [(s.donor_id, s.donor_start, s.target_start, s.length) for s in spans]


def chain_gate(mode: ChainMode, prompt_tokens: int, span_rows: Sequence[Sequence[Any]]) -> str:
    """The chain's deviation gate (default ``chain_max_deviation``, cost model open) on recorded spans."""
    spans = [Span(donor_id=d, donor_start=ds, target_start=ts, length=n) for d, ds, ts, n in span_rows]
    if not spans:
        return "none"
    verdict: ChainDecision = plan_chain(prompt_tokens, spans, mode.settings(mode.config(), deviation_gate=True))
    return "accepted" if verdict.accepted else str(verdict.reason.value if verdict.reason else "none")


CHAIN_HEADS = (0, 16, 64)
MODES: dict[str, Mode] = {
    "exact": EngineMode("exact", lambda: connector_config("exact")),
    "shifted": EngineMode("shifted", lambda: connector_config("shifted", max_deviation=1.0)),
    **{f"chain_h{h}": ChainMode(f"chain_h{h}", h) for h in CHAIN_HEADS},
}
