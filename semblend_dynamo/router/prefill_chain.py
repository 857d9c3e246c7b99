"""The router's side of a prefill chain (:mod:`semblend_dynamo.chain`): the requests it sends and how a step runs.

Every request of a chain goes to the donor's worker under the recipient's isolating salt, so each finds the previous
one in the engine's prefix cache. A step is the recipient's prompt cut to the step's prefix with one output token
(discarded); it is hinted like the real request, with role ``chain_step``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..audit import Role
from ..chain import ChainPlan, chain_requests
from ..events.schemas import DonorHint, request_key

__all__ = ["ChainStepFailed", "chain_hints", "run_step", "salted", "served_worker", "step_request"]

STEP_RESULTS = ("ok", "timeout", "error", "wrong_worker")
"""Labels of ``semblend_router_chain_steps_total``."""


class ChainStepFailed(Exception):
    """A step did not complete on the chain's worker; ``result`` is its metric label."""

    def __init__(self, result: str, detail: str) -> None:
        super().__init__(detail)
        self.result = result


def salted(request: Mapping[str, Any], salt: str) -> dict[str, Any]:
    """``request`` under ``salt``: Dynamo hashes blocks with ``routing.cache_namespace``, the backend reads nvext."""
    out = dict(request)
    out["routing"] = {**(out.get("routing") or {}), "cache_namespace": salt}
    extra = dict(out.get("extra_args") or {})
    nvext = extra.get("nvext")
    extra["nvext"] = {**(nvext if isinstance(nvext, Mapping) else {}), "cache_salt": salt}
    out["extra_args"] = extra
    return out


def step_request(forwarded: Mapping[str, Any], prompt_tokens: int) -> dict[str, Any]:
    """A prefill-only step: the forwarded (salted, pinned) request cut to ``prompt_tokens`` tokens, one output token."""
    out = dict(forwarded)
    out["token_ids"] = list(forwarded["token_ids"][:prompt_tokens])
    out["stop_conditions"] = {"max_tokens": 1}
    out["output_options"] = {}
    return out


def chain_hints(
    plan: ChainPlan, tokens: Sequence[int], recipient: DonorHint, donor_keys: Mapping[str, str | None], head_tokens: int
) -> list[tuple[int, DonorHint]]:
    """``(prompt tokens, hint)`` of every request of ``plan``, in order; the last is the real request's.

    Each hint names the donor of the load that request makes (a step that only computes own words names the first
    load's donor and no spans) and is keyed by that request's own tokens, so the connector matches it to that request.
    """
    out = []
    for part in chain_requests(plan):
        spans = part.load.spans if part.load is not None else []
        donor = (part.load or plan.loads[0]).spans[0].donor_id
        hint = DonorHint(
            request_key=request_key(list(tokens[: part.prompt_tokens])),
            request_id=recipient.request_id,
            donor_id=donor,
            donor_key=donor_keys.get(donor),
            worker_id=recipient.worker_id,
            dp_rank=recipient.dp_rank,
            namespace=recipient.namespace,
            similarity=recipient.similarity,
            spans=[(s.donor_start, s.target_start, s.length) for s in spans if s.donor_id == donor],
            decision=recipient.decision,
            trace_id=recipient.trace_id,
            role=Role.RECIPIENT if part.final else Role.CHAIN_STEP,
            chain_head_tokens=head_tokens,
        )
        out.append((part.prompt_tokens, hint))
    return out


async def run_step(
    generate: Callable[[dict[str, Any]], Awaitable[AsyncIterator[dict[str, Any]]]],
    request: dict[str, Any],
    worker_id: int,
    timeout_s: float,
) -> None:
    """Send one step and drain its output within ``timeout_s`` (cancelled past it); raises :class:`ChainStepFailed`."""
    try:
        served = await asyncio.wait_for(_drain(generate, request), timeout_s)
    except TimeoutError:
        raise ChainStepFailed("timeout", f"no answer within {timeout_s}s") from None
    except Exception as exc:
        raise ChainStepFailed("error", f"{type(exc).__name__}: {exc}") from None
    if served is None or served[0] != worker_id:
        raise ChainStepFailed("wrong_worker", f"served by {served[0] if served else 'an unknown worker'}")


async def _drain(
    generate: Callable[[dict[str, Any]], Awaitable[AsyncIterator[dict[str, Any]]]], request: dict[str, Any]
) -> tuple[int, int] | None:
    stream = await generate(request)
    served = None
    try:
        async for out in stream:
            served = served or served_worker(out)
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
    return served


def served_worker(out: Mapping[str, Any]) -> tuple[int, int] | None:
    """The worker Dynamo sent the request to, from the first response's ``routing_data``."""
    worker = ((out.get("routing_data") or {}).get("worker_id")) or {}
    worker_id = worker.get("decode_worker_id")
    if worker_id is None:
        return None
    return int(worker_id), int(worker.get("decode_dp_rank") or 0)
