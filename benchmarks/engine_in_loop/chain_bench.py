"""Prefill chain TTFT in the reference engine: a novel wrapper before the donor's evidence, chain against cold.

Each target is ``wrapper`` fresh random tokens, then ``share`` of the prompt taken from one donor's start (so the span
sits ``wrapper`` positions later than in the donor: a RoPE delta), then a fresh tail. A plain load cannot reach the
evidence (it does not start at the prompt's start); the chain runs one prefill-only step for the wrapper (rounded up
to a block after the head recompute) under the recipient's isolating salt, then the request itself, which finds the
step in the engine's salted prefix cache and loads the donor span after it.

Per prompt length, medians over ``repeats`` (after one warm-up target): the cold prefill through the engine's runner
and the cold whole request through the engine (no donor, fresh salt), both measured in the same run; the chain run
without the stage clock (whole-request figures) and again, under another salt, with it (the request's stages): its
time to first token (first step scheduled to the end of the request's prefill, CUDA-synchronized; each step's
finish, donor bookkeeping included, lies inside it), each step's wall time, and the per-step overhead: a step's wall
time less its own tokens at the cold prefill's per-token cost, also expressed in prefill tokens (the unit of
``SEMBLEND_CHAIN_STEP_OVERHEAD_TOKENS``). ``implied_step_overhead_tokens`` is the same over the whole chain: what the
steps add to the request's time to first token (gaps between requests included) less their tokens at that cost,
per step. Each request's bare compute (the runner prefilling the same tokens after the same prefix, no scheduling,
connector or pool) splits a step's overhead into the fixed cost of a short prefill and the engine's own
(``step_engine_overhead_ms``: a step's wall time less its bare compute).

Usage: ``PYTHONPATH=. TRITON_INTERPRET=0 python3 -m benchmarks.engine_in_loop.chain_bench 8192 3 [--wrapper 64]
[--short-prefills 32,96,256]`` (the last: bare prefills of those token counts from position 0, a step's compute)
(Llama-3-8B shape with random bf16 weights on a GPU, the tiny shape on a CPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
from typing import Any

import torch

from benchmarks.engine_in_loop.run_engine_bench import LLAMA3_8B_SHAPE, TINY_SPEED_SHAPE
from semblend_apps.reference_engine.hf_engine import (
    ChainRun,
    HFReferenceEngine,
    RequestRun,
    StageClock,
    cold_prefill,
)
from semblend_apps.reference_engine.hf_model import LOWER_RIGHT_SDPA, random_llama
from semblend_apps.reference_engine.prefill_runner import PrefillRunner
from semblend_dynamo.chain import ChainPlan, ChainRequest, ChainSettings, chain_requests, plan_chain
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.namespace import isolating_salt
from semblend_dynamo.span_aligner import SpanAligner

TENANT = "bench"


def chain_config(block_size: int) -> SemblendConfig:
    """Shifted mode with per-request isolating salts: the engine reuses blocks within a salt, chains on."""
    return SemblendConfig(
        block_size=block_size,
        exact_materialization_only=False,
        isolation="cache_salt",
        pin_budget_fraction=0.5,
        chain_enabled=True,
    )


def targets(
    vocab_size: int, length: int, share: float, wrapper: int, count: int, seed: int
) -> tuple[list[int], list[list[int]]]:
    """One donor and ``count`` targets: fresh wrapper, the donor's first ``share * length`` tokens, fresh tail."""
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(100, vocab_size) for _ in range(n)]

    evidence = int(length * share)
    donor = draw(evidence + 64)
    return donor, [draw(wrapper) + donor[:evidence] + draw(length - wrapper - evidence) for _ in range(count)]


def shapes(plan: ChainPlan) -> list[tuple[ChainRequest, int]]:
    """Each request of the chain with the tokens it computes (its prompt less what it finds held and what it loads)."""
    requests = chain_requests(plan)
    held = [0, *(r.prompt_tokens for r in requests)]
    return [
        (r, r.prompt_tokens - held[k] - (r.load.tokens if r.load is not None else 0)) for k, r in enumerate(requests)
    ]


def bare_prefill(runner: PrefillRunner, tokens: list[int], computed: int) -> float:
    """CUDA-synchronized seconds of the runner computing the last ``computed`` of ``tokens`` after the rest (no
    scheduling, connector or pool): a chain request's own compute."""
    clock = StageClock(cuda=runner.arena.kv.is_cuda)
    clock.timed("prefill", runner.prefill)(tokens, len(tokens) - computed, 1)
    return clock.seconds["prefill"]


def median_stages(runs: list[RequestRun]) -> dict[str, float]:
    """Median milliseconds per stage over ``runs``."""
    return {k: statistics.median(r.stages.get(k, 0.0) for r in runs) * 1e3 for k in runs[0].stages}


def run_chain_ttft(
    model: Any,
    *,
    length: int,
    share: float,
    wrapper: int,
    repeats: int,
    block_size: int,
    vocab_size: int,
    cuda_graphs: bool,
) -> dict[str, Any]:
    """Cold and chained TTFT of ``repeats`` targets (after a warm-up one) of ``length`` tokens; medians."""
    cfg = chain_config(block_size)
    donor, prompts = targets(vocab_size, length, share, wrapper, repeats + 1, seed=length)
    blocks = (len(donor) + 5 * length * (repeats + 1)) // block_size + 64
    engine = HFReferenceEngine(
        model, cfg, num_blocks=blocks, cuda_graphs=cuda_graphs, harness_checks=False, prefix_reuse=True
    )
    donor_run = engine.run(donor, cache_salt=isolating_salt(TENANT, "donor"))
    donor_id = engine.donor_id(donor_run)
    if donor_id is None:
        raise RuntimeError("the donor was not pinned")
    aligner = SpanAligner(block_size, cfg.min_span_tokens)
    aligner.add_donor("d", TENANT, donor)
    settings = ChainSettings.from_config(cfg)
    chains: list[ChainRun] = []
    staged_chains: list[ChainRun] = []
    cold_s: list[float] = []
    cold_whole_s: list[float] = []
    bare_s: list[list[float]] = []
    plan = None
    for i, prompt in enumerate(prompts):
        decision = plan_chain(length, aligner.align(TENANT, prompt), settings)
        if not decision.accepted or decision.plan is None:
            raise RuntimeError(f"the chain was declined: {decision.reason} {decision.detail}")
        plan = decision.plan
        cold = cold_prefill(model, prompt, runner=engine.runner)[2]
        bare = [bare_prefill(engine.runner, prompt[: r.prompt_tokens], computed) for r, computed in shapes(plan)]
        cold_whole = engine.run(prompt, cache_salt=isolating_salt(TENANT, f"cold-{i}")).first_token_s
        staged = engine.run_chain(prompt, plan, {"d": donor_id}, tenant=TENANT, nonce=f"staged-{i}")
        engine.clock.enabled = False  # the whole-request timing runs without the stage clock's device syncs
        chain = engine.run_chain(prompt, plan, {"d": donor_id}, tenant=TENANT, nonce=f"chain-{i}")
        engine.clock.enabled = True
        if i:  # the first target warms up kernels, the allocator and the CUDA graphs of every shape
            cold_s.append(cold)
            cold_whole_s.append(cold_whole)
            bare_s.append(bare)
            chains.append(chain)
            staged_chains.append(staged)
        for run in (*chain.steps, chain.final, *staged.steps, staged.final):
            run.cache = None
    assert plan is not None
    cold = statistics.median(cold_s)
    per_token = cold / length
    whole = statistics.median(c.first_token_s for c in chains)
    step_walls = [statistics.median(c.steps[k].wall_s for c in chains) for k in range(len(chains[0].steps))]
    computed = [n for _, n in shapes(plan)]
    step_computed = computed[:-1]
    bare = [statistics.median(b[k] for b in bare_s) for k in range(len(computed))]
    overheads = [w - n * per_token for w, n in zip(step_walls, step_computed, strict=True)]
    final_wall = statistics.median(c.final.first_token_s for c in chains)
    added = whole - final_wall - sum(step_computed) * per_token
    row = {
        "prompt_tokens": length,
        "wrapper_tokens": wrapper,
        "donor_share": share,
        "steps": plan.steps,
        "step_prefixes": plan.step_prefixes,
        "loaded_tokens": min(c.loaded for c in chains),
        "planned_tokens": plan.loaded_tokens,
        "computed_tokens": plan.computed_tokens,
        "predicted_speedup": plan.predicted_speedup,
        "cold_prefill_ms": cold * 1e3,
        "cold_whole_request_ms": statistics.median(cold_whole_s) * 1e3,
        "chain_whole_ms": whole * 1e3,
        "speedup_vs_cold_prefill": cold / whole,
        "speedup_vs_cold_whole_request": statistics.median(cold_whole_s) / whole,
        "step_wall_ms": [w * 1e3 for w in step_walls],
        "step_computed_tokens": step_computed,
        "step_overhead_ms": [o * 1e3 for o in overheads],
        "step_overhead_tokens": [o / per_token for o in overheads],
        "step_bare_prefill_ms": [b * 1e3 for b in bare[:-1]],
        "step_engine_overhead_ms": [(w - b) * 1e3 for w, b in zip(step_walls, bare[:-1], strict=True)],
        "implied_step_overhead_tokens": added / per_token / plan.steps,
        "final_request_first_token_ms": final_wall * 1e3,
        "final_computed_tokens": computed[-1],
        "final_bare_prefill_ms": bare[-1] * 1e3,
        "final_stages_ms": median_stages([s.final for s in staged_chains]),
        "step_stages_ms": [median_stages([s.steps[k] for s in staged_chains]) for k in range(plan.steps)],
        "cold_ms_per_token": per_token * 1e3,
        "cuda_graphs": cuda_graphs,
    }
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def short_prefills(model: Any, counts: list[int], vocab_size: int, *, cuda_graphs: bool) -> dict[int, dict[str, float]]:
    """Per token count: median milliseconds of a bare prefill from position 0 and of the model's linear layers alone
    on as many tokens (the weights' read floor; the rest is attention, norms and other small kernels)."""
    runner = PrefillRunner(model, cuda_graphs=cuda_graphs, capacity=max(counts))
    rng = random.Random(0)
    out = {}
    for n in counts:
        tokens = [rng.randrange(100, vocab_size) for _ in range(n)]
        bare_prefill(runner, tokens, n)
        prefill = statistics.median(bare_prefill(runner, tokens, n) for _ in range(5))
        out[n] = {"prefill_ms": prefill * 1e3, "linear_only_ms": linear_layers_s(model, n, cuda_graphs) * 1e3}
    return out


@torch.no_grad()
def linear_layers_s(model: Any, tokens: int, cuda_graphs: bool) -> float:
    """Median seconds (of 5) of every decoder linear layer on ``tokens`` rows plus the LM head on one (a CUDA graph
    replay on a GPU)."""
    param = next(model.parameters())
    linears = [m for m in model.model.modules() if isinstance(m, torch.nn.Linear)]
    rows = {f: torch.randn(tokens, f, dtype=param.dtype, device=param.device) for f in {m.in_features for m in linears}}
    last = torch.randn(1, model.lm_head.in_features, dtype=param.dtype, device=param.device)

    def forward() -> None:
        for m in linears:
            m(rows[m.in_features])
        model.lm_head(last)

    step = forward
    if cuda_graphs:
        forward()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        step = graph.replay
    clock = StageClock(cuda=param.is_cuda)
    times = []
    for _ in range(5):
        clock.reset()
        clock.timed("linear", step)()
        times.append(clock.seconds["linear"])
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", help="prompt lengths, comma-separated")
    parser.add_argument("repeats", type=int)
    parser.add_argument("--wrapper", type=int, default=64, help="novel tokens before the donor's evidence")
    parser.add_argument("--share", type=float, default=0.95, help="share of the prompt taken from the donor")
    parser.add_argument(
        "--short-prefills",
        default="",
        help="also time bare prefills of these token counts from position 0 (comma-separated): a step's compute",
    )
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    shape = LLAMA3_8B_SHAPE if gpu else TINY_SPEED_SHAPE
    model = random_llama(shape, "cuda" if gpu else "cpu", attn=LOWER_RIGHT_SDPA)
    if args.short_prefills:
        counts = [int(x) for x in args.short_prefills.split(",")]
        print("SHORT", json.dumps(short_prefills(model, counts, shape["vocab_size"], cuda_graphs=gpu)))
    for length in (int(x) for x in args.lengths.split(",")):
        row = run_chain_ttft(
            model,
            length=length,
            share=args.share,
            wrapper=args.wrapper,
            repeats=args.repeats,
            block_size=32,
            vocab_size=shape["vocab_size"],
            cuda_graphs=gpu,
        )
        print("ROW", json.dumps({"model": "llama3-8b" if gpu else "tiny", **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
