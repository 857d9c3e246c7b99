"""Where the materialized TTFT of the Hugging Face reference engine goes (Llama-3-8B shape, random bf16 weights,
lower-right SDPA).

Times, CUDA-synchronized, median of 3: a cold 8K prefill, the last 416 tokens alone, and the same 416 tokens on top
of a 7776-token past, first in a ``DynamicCache`` (what the reference engine did before the KV arena), then in the
engine's :class:`~semblend_apps.reference_engine.prefill_runner.PrefillRunner` eagerly and replaying a CUDA graph, and
profiles the eager ``DynamicCache`` and arena cases. Shows how much of the remaining prefill is the model on few
tokens, the cache concatenation that a paged engine (TensorRT-LLM) does not do, and the per-op dispatch.

    python3 -m benchmarks.engine_in_loop.prefill_breakdown
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.engine_in_loop.run_engine_bench import LLAMA3_8B_SHAPE
from semblend_apps.reference_engine.hf_model import LOWER_RIGHT_SDPA, random_llama
from semblend_apps.reference_engine.prefill_runner import PrefillRunner


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
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    model = random_llama(LLAMA3_8B_SHAPE, "cuda", attn=LOWER_RIGHT_SDPA)
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
        tokens = ids[0].tolist()
        runners = {"arena, eager": PrefillRunner(model), "arena, CUDA graph": PrefillRunner(model, cuda_graphs=True)}
        for name, runner in runners.items():
            runner.prefill(tokens, 0)
            cold = _median_ms(lambda r=runner: r.prefill(tokens, 0))
            rest = _median_ms(lambda r=runner: r.prefill(tokens, past_len))
            print(
                f"{name}: cold {n} tokens {cold:.1f} ms, {n - past_len} tokens on a {past_len}-token past {rest:.1f} ms"
            )
        acts = [torch.profiler.ProfilerActivity.CUDA]
        for name, fn in (
            ("DynamicCache", rest_on_past),
            ("arena, eager", lambda: runners["arena, eager"].prefill(tokens, past_len)),
        ):
            with torch.profiler.profile(activities=acts) as prof:
                fn()
                torch.cuda.synchronize()
            print(f"profile of the rest on a {name} past")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))


if __name__ == "__main__":
    main()
