"""Engine in the loop: TTFT and fidelity of materialized reuse, each against a cold prefill in the same run.

One command does everything (see ``run_all.sh``): train a small Llama offline (or take ``--model-dir``), then

1. fidelity: every workload of ``workloads.fidelity_cases`` in exact and shifted mode through the reference engine
   (``hf_engine.HFReferenceEngine``: real connector, planner and kernels; a ``transformers`` model in TensorRT-LLM's
   place), compared with a cold full prefill: max |logit diff|, KL, top-1 agreement and perplexity on a held-out
   continuation, greedy agreement over the first generated tokens, materialized share, declines by reason;
2. TTFT of the trained model and of a random-weight Llama-3-8B-shaped model at several prompt lengths, cold vs
   materialized (exact and shifted), with the connector's share of it.

Writes ``results.json`` and ``results.md`` under ``--results-dir``.

    python -m benchmarks.engine_in_loop.run_engine_bench --results-dir /tmp/engine-results
    python -m benchmarks.engine_in_loop.run_engine_bench --model-dir ./my-llama --heldout-jsonl docs.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine_in_loop import train_small_llama
from benchmarks.engine_in_loop.fidelity import compare
from benchmarks.engine_in_loop.workloads import Case, TokenSource, fidelity_cases, load_heldout, speed_cases
from semblend_apps.reference_engine.hf_engine import HFReferenceEngine, cold_prefill
from semblend_apps.reference_engine.hf_model import (
    LOWER_RIGHT_SDPA,
    greedy,
    load_model,
    prefill,
    random_llama,
    truncated,
)
from semblend_apps.reference_engine.prefill_runner import PrefillRunner
from semblend_dynamo.audit import AuditEvent
from semblend_dynamo.config import SemblendConfig

LLAMA3_8B_SHAPE: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
TINY_SPEED_SHAPE: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
}


def engine_config(mode: str, block_size: int) -> SemblendConfig:
    """The connector settings of a run: defaults except the mode, and a pin budget that holds the case's donors.

    Shifted mode runs with ``isolation=no_block_reuse`` (the harness does no device prefix reuse), as the connector
    requires for approximate KV.
    """
    return SemblendConfig(
        block_size=block_size,
        exact_materialization_only=mode == "exact",
        isolation="none" if mode == "exact" else "no_block_reuse",
        pin_budget_fraction=0.5,
    )


def pool_blocks(cases: list[Case], block_size: int) -> int:
    """Room for every donor and target of ``cases`` (plus one warm-up target) twice over: the pin budget is half."""
    tokens = sum(len(d) for c in cases for d in c.donors) + sum(len(c.prompt) + len(c.continuation) for c in cases)
    tokens += max(len(c.prompt) for c in cases)
    return 2 * (-(-tokens // block_size) + 2 * len(cases) + 4)


def _continue(
    model: Any, last_logits: torch.Tensor, cache: Any, case: Case, greedy_tokens: int
) -> tuple[torch.Tensor, list[int]]:
    """Logits predicting each continuation token (teacher forced after the prompt) and greedy tokens after the prompt.

    ``cache`` holds the prompt's KV; it is not modified (both passes run on truncated copies).
    """
    n = len(case.prompt)
    device = last_logits.device
    tokens = greedy(model, truncated(cache, n, model.config), last_logits[-1], greedy_tokens)
    ids = torch.tensor(case.continuation[:-1], device=device)
    rest, _ = prefill(model, ids, truncated(cache, n, model.config), keep=len(ids))
    return torch.cat([last_logits[-1:], rest]), tokens


def run_fidelity_case(model: Any, case: Case, mode: str, *, block_size: int, greedy_tokens: int) -> dict[str, Any]:
    """One case through a fresh engine and cold; the comparison row.

    Only the prompt goes through the engine (so nothing past it can be materialized); the held-out continuation is
    then teacher-forced on top of the warm and of the cold cache alike.
    """
    engine = HFReferenceEngine(model, engine_config(mode, block_size), num_blocks=pool_blocks([case], block_size))
    for donor in case.donors:
        engine.run(donor)
    n = len(case.prompt)
    warm = engine.run(case.prompt)
    cold_last, cold_cache, _ = cold_prefill(model, case.prompt)
    cold_logits, cold_greedy = _continue(model, cold_last, cold_cache, case, greedy_tokens)
    warm_logits, warm_greedy = _continue(model, warm.logits, warm.cache, case, greedy_tokens)
    targets = torch.tensor(case.continuation, device=cold_logits.device)
    fid = compare(cold_logits, warm_logits, targets, cold_greedy, warm_greedy)
    row: dict[str, Any] = {
        "case": case.name,
        "kind": case.kind,
        "mode": mode,
        "prompt_tokens": n,
        "reusable_tokens": case.reusable_prefix_tokens,
        "materialized": warm.materialized,
        "share": warm.materialized / n,
        "position_delta": case.position_delta if warm.materialized else 0,
        "declined": warm.declined,
        **fid.model_dump(),
    }
    if warm.materialized:
        # bf16 noise floor: the same split (prefix, then the rest with past KV) computed cold, without the pool.
        split = PrefillRunner(model)
        split.prefill(case.prompt[: warm.materialized], 0)
        split_last = split.prefill(case.prompt, warm.materialized)
        split_logits, _ = _continue(model, split_last, split.arena.cache(n), case, 0)
        row["noise_floor_max_abs_logit_diff"] = float((cold_logits - split_logits).abs().max())
    return row


def run_ttft(
    model: Any,
    *,
    label: str,
    lengths: list[int],
    share: float,
    shift: int,
    repeats: int,
    block_size: int,
    vocab_size: int,
    cuda_graphs: bool,
) -> list[dict[str, Any]]:
    """Cold vs materialized TTFT per prompt length (medians over ``repeats``); ``shift`` > 0 is shifted mode.

    The stage figures come from ``repeats`` targets timed stage by stage (a device sync around each stage); the
    whole-request figures from ``repeats`` further targets run without the stage clock, as a client would see them.

    Each target loads from its own donor (all prefilled before the timed targets); ``loaded_deltas`` lists the
    position delta of every timed target's load, as the connector audited it.

    Cold and materialized prefills run through the engine's one runner, so both are eager or both replay CUDA graphs;
    the warm-up requests capture the graphs before anything is timed (``graph_captures_timed`` says if one was not).
    """
    mode = "shifted" if shift else "exact"
    rows = []
    for length in lengths:
        # the first case warms up (kernels, allocator, CUDA graphs of both shapes); the others are timed
        warmup, *cases = speed_cases(vocab_size, length, share, repeats=2 * repeats + 1, seed=length, shift=shift)
        engine = HFReferenceEngine(
            model,
            engine_config(mode, block_size),
            num_blocks=pool_blocks([warmup, *cases], block_size),
            cuda_graphs=cuda_graphs,
            harness_checks=False,  # the harness's own write check is no part of a request's time
        )
        engine.run(warmup.donors[0])
        cold_prefill(model, warmup.prompt, runner=engine.runner)
        engine.run(warmup.prompt)
        for case in cases:  # every target's donor, resident before anything is timed
            engine.run(case.donors[0])
        captures_before = engine.runner.captures
        cold_s, warm_runs, whole_runs = [], [], []
        deltas: list[int | None] = []
        for k, case in enumerate(cases):
            records = len(engine.audit.records or [])
            # half the targets with the stage clock (its device syncs), half without it for the whole-request time
            engine.clock.enabled = k < repeats
            if engine.clock.enabled:
                cold_s.append(cold_prefill(model, case.prompt, runner=engine.runner)[2])
            (warm_runs if engine.clock.enabled else whole_runs).append(engine.run(case.prompt))
            (warm_runs if engine.clock.enabled else whole_runs)[-1].cache = None  # only the timings are kept
            deltas += [r.delta for r in (engine.audit.records or [])[records:] if r.event == AuditEvent.PROMISED]
        engine.clock.enabled = True
        stages = {k: statistics.median(r.stages.get(k, 0.0) for r in warm_runs) for k in warm_runs[0].stages}
        cold = statistics.median(cold_s)
        warm = statistics.median(r.ttft_s for r in warm_runs)
        whole = statistics.median(r.wall_s for r in whole_runs)
        first_token = statistics.median(r.first_token_s for r in whole_runs)
        materialized = min(r.materialized for r in (*warm_runs, *whole_runs))
        rows.append(
            {
                "model": label,
                "mode": mode,
                "prompt_tokens": length,
                "materialized": materialized,
                "share": materialized / length,
                "position_delta": -shift if materialized else 0,
                "loaded_deltas": deltas,
                "cold_ttft_ms": cold * 1e3,
                "warm_ttft_ms": warm * 1e3,
                "ratio": cold / warm,
                "warm_whole_request_ms": whole * 1e3,
                "ratio_whole_request": cold / whole,
                "warm_first_token_ms": first_token * 1e3,
                "ratio_first_token": cold / first_token,
                "ideal_ratio": 1 / (1 - materialized / length),
                "stages_ms": {k: v * 1e3 for k, v in stages.items()},
                "worker_share_of_cold": stages.get("connector_worker", 0.0) / cold,
                "connector_share_of_warm": (
                    stages.get("connector_worker", 0.0) + stages.get("connector_scheduler", 0.0)
                )
                / warm,
                "declined": warm_runs[-1].declined,
                "cuda_graphs": cuda_graphs,
                "graph_captures_timed": engine.runner.captures - captures_before,
            }
        )
        print(f"[ttft] {json.dumps(rows[-1])}")
        del engine
        gc.collect()  # the stage-clock wrappers make reference cycles; the pool and graphs go only with them
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, dict):
        return ", ".join(f"{k}:{v}" for k, v in x.items()) or "-"
    return str(x)


def _table(cols: list[str], rows: list[list[str]]) -> list[str]:
    """Markdown lines: header, separator, one line per row of already formatted cells."""
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(results: dict[str, Any]) -> str:
    """The results as the tables docs/benchmarks.md carries."""
    out = [f"hardware: {results['hardware']}", ""]
    if results.get("train"):
        t = results["train"]
        out += [
            "| params (M) | vocab | train tokens | steps | tokens seen | train s | held-out docs | held-out ppl |",
            "|---|---|---|---|---|---|---|---|",
            f"| {t['params_millions']:.1f} | {t['vocab_size']} | {t['train_tokens']} | {t['steps']} | {t['tokens_seen']} "
            f"| {t['train_seconds']:.0f} | {t['heldout_docs']} | {t['heldout_perplexity']:.2f} |",
            "",
        ]
    cols = [
        "case",
        "mode",
        "prompt_tokens",
        "materialized",
        "share",
        "position_delta",
        "max_abs_logit_diff",
        "noise_floor_max_abs_logit_diff",
        "mean_kl",
        "top1_agreement",
        "ppl_cold",
        "ppl_warm",
        "greedy_agreement",
        "declined",
    ]
    out += _table(cols, [[_fmt(row.get(c, "-")) for c in cols] for row in results["fidelity"]])
    out.append("")
    cols = [
        "model",
        "mode",
        "prompt_tokens",
        "share",
        "cold_ttft_ms",
        "warm_ttft_ms",
        "ratio",
        "warm_whole_request_ms",
        "ratio_whole_request",
        "ideal_ratio",
        "worker_share_of_cold",
        "graph_captures_timed",
        "stages_ms",
    ]
    out += _table(
        cols,
        [
            [_fmt({k: round(v, 3) for k, v in row[c].items()}) if c == "stages_ms" else _fmt(row[c]) for c in cols]
            for row in results["ttft"]
        ],
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    train_small_llama.add_arguments(parser)
    parser.add_argument("--model-dir", type=Path, default=None, help="a Hugging Face causal-LM dir (skips training)")
    parser.add_argument("--heldout-jsonl", type=Path, default=None, help='{"text": ...} lines for the workloads')
    parser.add_argument("--results-dir", type=Path, default=Path("/tmp/engine-results"))
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="fidelity prompt length")
    parser.add_argument("--continuation-tokens", type=int, default=128)
    parser.add_argument("--greedy-tokens", type=int, default=16)
    parser.add_argument("--shares", default="0.25,0.5,0.75,0.9")
    parser.add_argument("--deltas", default="32,100,500,1000")
    parser.add_argument("--ttft-lengths", default="2048,8192,16384")
    parser.add_argument("--ttft-share", type=float, default=0.95)
    parser.add_argument("--ttft-shift", type=int, default=100, help="donor offset of the shifted TTFT runs")
    parser.add_argument(
        "--share-sweep",
        default="0.5,0.75,0.9",
        help="more materialized shares for the speed shape (exact mode, --share-sweep-tokens); empty for none",
    )
    parser.add_argument("--share-sweep-tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--attn", choices=[LOWER_RIGHT_SDPA, "sdpa"], default=LOWER_RIGHT_SDPA, help="attention of the reference engine"
    )
    parser.add_argument(
        "--prefill",
        choices=["graphs", "eager"],
        default=None,
        help="TTFT runs replay CUDA graphs (default on a GPU) or run eagerly; the speed shape also runs the other, "
        "exact mode only, for comparison",
    )
    parser.add_argument("--speed-shape", choices=["llama3-8b", "tiny", "none"], default="llama3-8b")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hardware = (
        torch.cuda.get_device_name() if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    )
    results: dict[str, Any] = {"hardware": hardware, "argv": sys.argv, "torch": torch.__version__}
    prefill_mode = args.prefill or ("graphs" if device == "cuda" else "eager")
    if prefill_mode == "graphs" and device != "cuda":
        parser.error("--prefill graphs needs a CUDA device")
    started = time.perf_counter()
    args.results_dir.mkdir(parents=True, exist_ok=True)

    model_dir = args.model_dir
    heldout = args.heldout_jsonl
    if model_dir is None:
        results["train"] = dataclasses.asdict(train_small_llama.train_from_args(args))
        model_dir, heldout = args.out_dir / "model", args.out_dir / "heldout.jsonl"
    elif heldout is None:
        _, docs = train_small_llama.collect_corpus(int(args.max_corpus_mb * 1e6), args.heldout_percent)
        heldout = args.results_dir / "heldout.jsonl"
        heldout.write_text("".join(json.dumps({"text": d.text}) + "\n" for d in docs))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = load_model(model_dir, device, attn=args.attn)
    results["fidelity"], results["ttft"], results["errors"] = [], [], []

    def phase(name: str, fn: Any, *fn_args: Any) -> None:
        """Run one phase; a failure is recorded and the next phase still runs. Results are saved after each."""
        try:
            fn(*fn_args)
        except Exception:
            results["errors"].append({"phase": name, "traceback": traceback.format_exc()})
            print(f"[bench] phase {name} failed:\n{traceback.format_exc()}")
        print(f"[bench] {name} done at {time.perf_counter() - started:.0f}s")
        (args.results_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))

    def fidelity_phase(model: Any) -> None:
        src = TokenSource(load_heldout(heldout, tokenizer))
        cases = list(
            fidelity_cases(
                src,
                prompt_tokens=args.prompt_tokens,
                continuation_tokens=args.continuation_tokens,
                shares=tuple(float(s) for s in args.shares.split(",")),
                deltas=tuple(int(d) for d in args.deltas.split(",")),
                rag_chunk_tokens=args.prompt_tokens // 4,
                header_tokens=args.prompt_tokens // 8,
            )
        )
        for mode in ("exact", "shifted"):
            for case in cases:
                row = run_fidelity_case(model, case, mode, block_size=args.block_size, greedy_tokens=args.greedy_tokens)
                results["fidelity"].append(row)
                print(f"[fidelity] {json.dumps(row)}")

    lengths = [int(x) for x in args.ttft_lengths.split(",")]
    common = {"share": args.ttft_share, "repeats": args.repeats, "block_size": args.block_size}

    def trained_ttft_phase(model: Any) -> None:
        max_pos = getattr(model.config, "max_position_embeddings", max(lengths))
        for shift in (0, args.ttft_shift):
            results["ttft"] += run_ttft(
                model,
                label=f"trained ({prefill_mode})",
                lengths=[n for n in lengths if n + shift + 64 <= max_pos],
                shift=shift,
                vocab_size=len(tokenizer),
                cuda_graphs=prefill_mode == "graphs",
                **common,
            )

    def speed_phase() -> None:
        shape = LLAMA3_8B_SHAPE if args.speed_shape == "llama3-8b" else TINY_SPEED_SHAPE
        speed_model = random_llama(shape, device, attn=args.attn)

        def speed(mode: str, shift: int, speed_lengths: list[int], share: float) -> None:
            results["ttft"] += run_ttft(
                speed_model,
                label=f"{args.speed_shape} ({mode})",
                lengths=speed_lengths,
                shift=shift,
                vocab_size=shape["vocab_size"],
                cuda_graphs=mode == "graphs",
                **{**common, "share": share},
            )

        other = ["eager" if prefill_mode == "graphs" else "graphs"] if device == "cuda" else []
        for shift in (0, args.ttft_shift):
            speed(prefill_mode, shift, lengths, args.ttft_share)
        for mode in other:
            speed(mode, 0, lengths, args.ttft_share)
        for share in [float(x) for x in args.share_sweep.split(",") if x]:
            speed(prefill_mode, 0, [args.share_sweep_tokens], share)

    phase("fidelity", fidelity_phase, model)
    phase("ttft_trained", trained_ttft_phase, model)
    del model
    if args.speed_shape != "none":
        phase("ttft_speed_shape", speed_phase)
    results["wall_seconds"] = time.perf_counter() - started
    (args.results_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (args.results_dir / "results.md").write_text(markdown(results))
    print(markdown(results))
    print(f"[bench] done in {results['wall_seconds']:.0f}s")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
