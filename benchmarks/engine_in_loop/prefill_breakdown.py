"""Where the materialized TTFT of the Hugging Face reference engine goes (Llama-3-8B shape, random bf16 weights).

Times, CUDA-synchronized, median of 3: a cold 8K prefill, the last 416 tokens alone, and the same 416 tokens on top
of a 7776-token past in a ``DynamicCache`` (what the reference engine does after materialization), then profiles the
last case. Shows how much of the remaining prefill is the model on few tokens and how much is the cache concatenation
that a paged engine (TensorRT-LLM) does not do.

    python3 -m benchmarks.engine_in_loop.prefill_breakdown
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def _median_ms(fn: Callable[[], Any], repeats: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - start) * 1e3)
    return sorted(out)[repeats // 2]


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        attn_implementation="sdpa",
    )
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    n, past_len = 8192, 7776
    ids = torch.randint(0, 128000, (1, n), device="cuda")
    with torch.no_grad():
        past = model(ids[:, :past_len], use_cache=True, logits_to_keep=1).past_key_values

        def rest_on_past() -> Any:
            cache = DynamicCache()
            for i, layer in enumerate(past.layers):
                cache.update(layer.keys, layer.values, i)
            positions = torch.arange(past_len, n, device="cuda")[None]
            return model(ids[:, past_len:], past_key_values=cache, position_ids=positions, logits_to_keep=1)

        print(f"cold prefill {n} tokens: {_median_ms(lambda: model(ids, logits_to_keep=1)):.1f} ms")
        alone = _median_ms(lambda: model(ids[:, : n - past_len], logits_to_keep=1))
        print(f"{n - past_len} tokens alone: {alone:.1f} ms")
        print(f"{n - past_len} tokens on a {past_len}-token DynamicCache past: {_median_ms(rest_on_past):.1f} ms")
        acts = [torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            rest_on_past()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))


if __name__ == "__main__":
    main()
