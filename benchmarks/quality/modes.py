"""Reuse modes a recipient can run under; each is one way of producing its warm prefill.

A mode takes the donor prompts and the recipient prompt (token ids) and returns the recipient's :class:`WarmRun`.
``exact`` and ``shifted`` run the reference engine (SmolLM2 through the SemBlend connector over a paged pool in
TensorRT-LLM's layout) with the connector in that mode. ``shifted`` runs with the deviation gate open
(``max_deviation=1``) and records the planner's input, so that one run shows both what the gate decides (the planner
is pure: :func:`gate` replays its input under the default settings) and what a declined case would have done. A
further mode (e.g. a router-orchestrated prefill chain) is one more :class:`Mode` in :data:`MODES`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from semblend_apps.reference_engine.hf_engine import HFReferenceEngine
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.planner import PlanDecision, Planner

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


MODES: dict[str, Mode] = {
    "exact": EngineMode("exact", lambda: connector_config("exact")),
    "shifted": EngineMode("shifted", lambda: connector_config("shifted", max_deviation=1.0)),
}
