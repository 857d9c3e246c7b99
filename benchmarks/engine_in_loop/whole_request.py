"""Whole-request TTFT of the reference engine beside its stage sums, cold against 95% materialized (speed shape only).

Runs :func:`run_ttft` of the engine benchmark on the Llama-3-8B shape with random weights (the tiny shape on a CPU),
exact and shifted, CUDA-graph prefill; the harness's own write check is off in these timed runs.

Usage: ``PYTHONPATH=. TRITON_INTERPRET=0 python3 -m benchmarks.engine_in_loop.whole_request 8192 3``
(prompt lengths, repeats).
"""

import json
import sys

import torch

from benchmarks.engine_in_loop.run_engine_bench import LLAMA3_8B_SHAPE, TINY_SPEED_SHAPE, run_ttft
from semblend_apps.reference_engine.hf_model import LOWER_RIGHT_SDPA, random_llama


def main(argv: list[str]) -> int:
    gpu = torch.cuda.is_available()
    shape = LLAMA3_8B_SHAPE if gpu else TINY_SPEED_SHAPE
    lengths = [int(x) for x in argv[0].split(",")]
    model = random_llama(shape, "cuda" if gpu else "cpu", attn=LOWER_RIGHT_SDPA)
    rows = []
    for shift in (0, 100):
        rows += run_ttft(
            model,
            label="llama3-8b" if gpu else "tiny",
            lengths=lengths,
            share=0.95,
            shift=shift,
            repeats=int(argv[1]),
            block_size=32,
            vocab_size=shape["vocab_size"],
            cuda_graphs=gpu,
        )
    for r in rows:
        print(
            "ROW",
            json.dumps(
                {
                    k: r[k]
                    for k in (
                        "mode",
                        "prompt_tokens",
                        "share",
                        "cold_ttft_ms",
                        "warm_ttft_ms",
                        "ratio",
                        "warm_whole_request_ms",
                        "ratio_whole_request",
                        "warm_first_token_ms",
                        "ratio_first_token",
                        "graph_captures_timed",
                        "loaded_deltas",
                    )
                }
            ),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
