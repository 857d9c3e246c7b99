"""Scheduler decision latency: ``get_num_new_matched_tokens`` with ~10K pinned donor blocks, next to a no-op connector.

Run: ``.venv/bin/python benchmarks/bench_connector.py [--prompt-tokens 8192] [--mode exact|shifted] [--requests 2000]
[--heap-objects 3000000 --gc-threshold 20000]``

The SemBlend scheduler holds donors pinning ``--pinned-blocks`` blocks (budget = 10% of a virtual pool; no KV tensor
is needed for a scheduler decision). Each measured request goes through the real per-request scheduler calls
(``get_num_new_matched_tokens`` timed; ``update_state_after_alloc``, ``build_connector_meta`` and ``request_finished``
untimed, so leases, promises and the per-request state are settled as in PyExecutor; a request finishes without
offering its blocks, so the donors stay the same; ``--no-finish`` leaves every request unfinished, the flow before
issue 16.2's third pass, in which the scheduler's per-request state grows for the whole run). ``--get-tokens convert``
makes the request's ``get_tokens`` build a new list of new ints from an int32 vector on every read, as TensorRT-LLM's
binding does (its ``LlmRequest`` holds the tokens in C++); the default ``copy`` copies a Python list, which costs
several times less (the figures of earlier sessions); ``view`` hands over a read-only int32 view of that vector, what
a binding exposing it as a buffer would give (TensorRT-LLM has none today). Cases: a miss (no donor shares the prompt), a hit (the prompt starts with
a donor's first 3/4), and a hit named by a router hint; in ``--mode shifted`` (the span aligner runs, isolation
``no_block_reuse``) also a shifted hit (3/4 of a donor taken from its token 40 on, so its KV moves by -40 positions). The no-op connector (returns ``(0, False)``) is the baseline
measured in the same run. Audit records go to a real JSONL file, as in production (``--audit memory`` shows how much
of the decision the audit's file writes take).

Besides wall-clock p50/p99, each case reports the thread's CPU time per decision (p50/p99), the share of decisions
during which the thread was preempted (involuntary context switches: on a loaded machine the wall-clock p99 is
mostly these) and the garbage collections that ran inside a timed decision, per 1,000 decisions and generation.
``--heap-objects N`` keeps N live GC-tracked objects (one-element lists) during the run, like the large heap of a
TensorRT-LLM process, so a collection that walks the old generations costs what it would there;
``--gc-threshold N`` sets the generation-0 threshold (TensorRT-LLM's executor loop runs with its
``garbage_collection_gen0_threshold``, 20,000 by default; Python's default is 700). ``--busy-thread-us N`` runs another
Python thread in the process, N µs of Python work then 2N µs of sleep, over and over (like TensorRT-LLM's response
and stats threads beside the executor loop), and reports the share of decisions during which it ran (took the GIL).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semblend_dynamo.audit import AuditWriter
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.events.schemas import DonorHint, request_key
from trtllm_connector.base import KvCacheConnectorScheduler, SchedulerOutput
from trtllm_connector.connector import SemBlendConnectorScheduler
from trtllm_connector.engine_state import EngineState, PoolState
from trtllm_connector.harness import HarnessLlmArgs, HarnessRequest
from trtllm_connector.hints import HintInbox

TPB = 32
GET_TOKENS = {"copy": "list", "convert": "vector", "view": "view"}  # --get-tokens -> HarnessRequest(tokens_from=...)
LLAMA_3_8B_ROPE = json.dumps(
    {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "rope_theta": 500000.0,
    }
)


class NoOpConnectorScheduler(KvCacheConnectorScheduler):
    """The baseline: a connector that never matches anything."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, block_ids: list[int]) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> object:
        return None

    def request_finished(self, request: Any, cache_block_ids: list[int]) -> bool:
        return False


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def build_scheduler(
    args: argparse.Namespace, audit_path: Path | None
) -> tuple[SemBlendConnectorScheduler, list[list[int]]]:
    blocks_per_donor = args.prompt_tokens // TPB
    # Budget (10% of the pool) = the pinned target plus the headroom the registry keeps for the next donor.
    num_blocks = (args.pinned_blocks + 2 * blocks_per_donor) * 10
    shifted = args.mode == "shifted"
    llm_args = HarnessLlmArgs(TPB, enable_block_reuse=not shifted)
    EngineState.of(llm_args).publish_pool(PoolState(num_blocks=num_blocks, num_layers=32, geometry_ok=True))
    cfg = SemblendConfig(
        block_size=TPB,
        pin_budget_fraction=0.1,
        min_donor_tokens=TPB,
        exact_materialization_only=not shifted,
        isolation="no_block_reuse" if shifted else "none",
        rope_config=LLAMA_3_8B_ROPE,
    )
    sched = SemBlendConnectorScheduler(
        llm_args, config=cfg, audit=AuditWriter(audit_path), hints=HintInbox(capacity=1 << 16)
    )
    rng = random.Random(0)
    donors: list[list[int]] = []
    next_block = 0
    request_id = 1
    while sched.registry.pinned_blocks + blocks_per_donor <= args.pinned_blocks:
        tokens = [rng.randrange(1, 32000) for _ in range(args.prompt_tokens)]
        ok = sched.request_finished(
            HarnessRequest(request_id, tokens), list(range(next_block, next_block + blocks_per_donor))
        )
        assert ok, "donor refused: budget too small for the requested pinned blocks"
        donors.append(tokens)
        next_block += blocks_per_donor
        request_id += 1
    return sched, donors


@dataclass
class CaseResult:
    """One case's decisions: wall-clock and thread CPU µs, preemptions, collections inside them, promises."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    preempted: int = 0
    other_thread_ran: int = 0
    promised: int = 0
    collections: list[int] = field(default_factory=lambda: [0, 0, 0])


class BusyThread:
    """Another Python thread of the process: ``burst_us`` of Python work, then twice that asleep, until stopped."""

    def __init__(self, burst_us: int) -> None:
        self.burst_s = burst_us / 1e6
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            end = time.perf_counter() + self.burst_s
            while time.perf_counter() < end:
                self.ticks += 1
            time.sleep(2 * self.burst_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class GcCounter:
    """Counts the garbage collections that start while ``active`` is set (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.active: CaseResult | None = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start" and self.active is not None:
            self.active.collections[info["generation"]] += 1


def measure(
    decide: Callable[[HarnessRequest], tuple[int, bool]],
    settle: Callable[[HarnessRequest], None],
    prompts: list[list[int]],
    counter: GcCounter,
    busy: BusyThread | None = None,
    tokens_from: str = "list",
) -> CaseResult:
    """Each request's decision timed (wall clock and thread CPU), then settled untimed."""
    out = CaseResult()
    for i, tokens in enumerate(prompts):
        request = HarnessRequest(10_000_000 + i, tokens, tokens_from=tokens_from)
        switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        ticks = busy.ticks if busy is not None else 0
        counter.active = out
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        tokens_promised, _ = decide(request)
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        counter.active = None
        out.other_thread_ran += busy is not None and busy.ticks != ticks
        out.wall.append((t1 - t0) / 1e3)
        out.cpu.append((c1 - c0) / 1e3)
        out.preempted += resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw > switches
        out.promised += tokens_promised > 0
        settle(request)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--pinned-blocks", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--mode", choices=("exact", "shifted"), default="exact", help="exact prefix or span aligner")
    parser.add_argument("--audit", choices=("file", "memory"), default="file", help="audit JSONL file or in memory")
    parser.add_argument("--heap-objects", type=int, default=0, help="live GC-tracked objects kept during the run")
    parser.add_argument("--gc-threshold", type=int, default=0, help="generation-0 GC threshold (0: Python's default)")
    parser.add_argument("--no-finish", action="store_true", help="never call request_finished (the earlier flow)")
    parser.add_argument("--busy-thread-us", type=int, default=0, help="another Python thread's work bursts (0: none)")
    parser.add_argument(
        "--get-tokens",
        choices=tuple(GET_TOKENS),
        default="copy",
        help="the request's get_tokens: a copy of a Python list, a new list converted from an int32 vector as "
        "TensorRT-LLM's binding makes it, or a zero-copy int32 view of that vector",
    )
    args = parser.parse_args()
    tokens_from = GET_TOKENS[args.get_tokens]
    if args.heap_objects < 0 or args.gc_threshold < 0 or args.busy_thread_us < 0:
        parser.error("--heap-objects, --gc-threshold and --busy-thread-us must be >= 0")
    rng = random.Random(1)

    with tempfile.TemporaryDirectory() as tmp:
        sched, donors = build_scheduler(args, Path(tmp) / "audit.jsonl" if args.audit == "file" else None)
        noop = NoOpConnectorScheduler(HarnessLlmArgs(TPB))
        target_block = args.pinned_blocks * 2  # targets never reuse donor blocks
        cut = args.prompt_tokens * 3 // 4

        def fresh(n: int) -> list[int]:
            return [rng.randrange(1, 32000) for _ in range(n)]

        misses = [fresh(args.prompt_tokens) for _ in range(args.requests)]
        hits = [rng.choice(donors)[:cut] + fresh(args.prompt_tokens - cut) for _ in range(args.requests)]
        shift = TPB + TPB // 4  # not a whole block: the donor's KV must move (RoPE delta -40)
        shifted_hits = [rng.choice(donors)[shift : shift + cut] + fresh(args.prompt_tokens - cut) for _ in hits]

        def settle(request: HarnessRequest) -> None:
            nonlocal target_block
            n = -(-request.prompt_len // TPB)
            blocks = list(range(target_block, target_block + n))
            target_block += n
            sched.update_state_after_alloc(request, blocks)
            sched.build_connector_meta(SchedulerOutput())
            if not args.no_finish:
                sched.request_finished(request, [])  # no blocks offered: not a donor

        def hinted(request: HarnessRequest) -> Any:
            tokens = request.engine_tokens()
            donor_index = next(i for i, d in enumerate(donors) if d[:TPB] == tokens[:TPB])
            sched.hints.submit(
                DonorHint(
                    request_key=request_key(tokens),
                    donor_id=sched.registry.donor_id_for(donor_index + 1),
                    worker_id=0,
                    namespace=sched.model.namespace().digest(),
                    decision="semantic_placement",
                )
            )
            return None

        hinted_prompts = hits[: args.requests // 2]
        for tokens in hinted_prompts:
            hinted(HarnessRequest(0, tokens))
        heap = [[i] for i in range(args.heap_objects)]
        if args.gc_threshold:
            gc.set_threshold(args.gc_threshold)
        gc.collect()  # the setup's garbage is not the decisions'
        counter = GcCounter()
        busy = BusyThread(args.busy_thread_us) if args.busy_thread_us else None

        def semblend(prompts: list[list[int]]) -> CaseResult:
            return measure(
                lambda r: sched.get_num_new_matched_tokens(r, 0), settle, prompts, counter, busy, tokens_from
            )

        results: dict[str, CaseResult] = {}
        results["no-op connector (baseline)"] = measure(
            lambda r: noop.get_num_new_matched_tokens(r, 0), lambda r: None, misses, counter, busy, tokens_from
        )
        results["SemBlend, miss"] = semblend(misses)
        results["SemBlend, hit (local lookup)"] = semblend(hits)
        if args.mode == "shifted":
            results["SemBlend, shifted hit (local search)"] = semblend(shifted_hits)
        results["SemBlend, hit (router hint)"] = semblend(hinted_prompts)
        thresholds = gc.get_threshold()
        del heap
        if busy is not None:
            busy.stop()
        promised = sched.audit.by_event["promised"]
        declined = dict(sched.audit.by_reason)
        pinned = sched.registry.pinned_blocks
        sched.audit.close()

    base_p99 = percentiles(results["no-op connector (baseline)"].wall)[1]
    print(
        f"prompt {args.prompt_tokens} tokens, {pinned} pinned blocks in {len(donors)} donors, "
        f"tokens_per_block {TPB}, mode {args.mode}, audit to {args.audit}, get_tokens {args.get_tokens}, "
        f"requests {'left unfinished' if args.no_finish else 'finished after their iteration'}"
    )
    print(f"heap: {args.heap_objects} extra live objects, gc thresholds {thresholds}")
    if args.busy_thread_us:
        print(f"another Python thread: {args.busy_thread_us} µs bursts, {2 * args.busy_thread_us} µs asleep between")
    print(f"load average (1/5/15 min) at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"promises: {promised}; declines by reason: {declined}")
    print(
        "| case | n | promised | p50 (µs) | p99 (µs) | p99 - baseline p99 (µs) | CPU p50 / p99 (µs) | preempted "
        "| collections per 1,000 (gen 0/1/2) | other thread ran |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        p50, p99 = percentiles(r.wall)
        cpu50, cpu99 = percentiles(r.cpu)
        n = len(r.wall)
        per_1000 = "/".join(f"{c * 1000 / n:.1f}" for c in r.collections)
        print(
            f"| {name} | {n} | {r.promised} | {p50:.1f} | {p99:.1f} | {p99 - base_p99:.1f} | {cpu50:.1f} / {cpu99:.1f} "
            f"| {r.preempted / n:.1%} | {per_1000} | {r.other_thread_ran / n:.1%} |"
        )


if __name__ == "__main__":
    main()
