"""Connector worker path on a GPU: `start_load_kv` time vs a raw copy of the same bytes, in one run.

Drives SemBlend's real scheduler and worker through the PyExecutor harness (trtllm_connector/harness.py, the
context-free stand-in model) over a pool of a Llama-3-8B-shaped geometry (32 layers, 8 KV heads, head dim 128,
32-token blocks, bf16), materializes a donor prefix of ~95% of a long prompt (exact, delta 0) and a shifted span
(delta != 0, Triton RoPE delta), and prints the worker's time (CUDA-synchronized) next to the device copy bandwidth
measured on the same pool, plus a profiler table of where the worker's time goes.

    python benchmarks/bench_connector_worker.py --tokens 8192 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from semblend_dynamo.config import SemblendConfig
from trtllm_connector.harness import PyExecutorHarness


def _prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 30000, (n,), generator=g).tolist()


def _timed(fn: Callable[..., Any], out: list[float], sync: Callable[[], None]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sync()
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sync()
            out.append(time.perf_counter() - start)

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    bs, n = 32, args.tokens
    blocks_per_req = n // bs + 2
    num_blocks = blocks_per_req * (2 * args.repeats + 4)
    bytes_per_token = args.layers * 2 * args.heads * args.head_dim * 2
    print(f"device={args.device} tokens={n} layers={args.layers} kv_heads={args.heads} head_dim={args.head_dim}")

    for mode in ("exact", "shifted"):
        settings: dict[str, Any] = {
            "block_size": bs,
            "min_span_tokens": 64,
            "min_donor_tokens": 64,
            "pin_budget_fraction": 0.5,
            "max_spans": 8,
        }
        if mode == "shifted":
            settings.update(exact_materialization_only=False, isolation="no_block_reuse", max_deviation=0.9)
        h = PyExecutorHarness.with_stand_in(
            SemblendConfig(**settings),
            num_layers=args.layers,
            num_kv_heads=args.heads,
            head_dim=args.head_dim,
            num_blocks=num_blocks,
            rope_theta=500000.0,
            device=args.device,
            context_free=True,  # times the copy only; the KV content does not matter here
        )
        times: list[float] = []
        h.worker.start_load_kv = _timed(h.worker.start_load_kv, times, sync)  # type: ignore[method-assign]
        donor = _prompt(1, n)
        h.run_request(donor, capture_kv=False)
        times.clear()
        promised = []
        for i in range(args.repeats):
            tail = _prompt(100 + i, n // 20)
            # shifted: the donor's text from token 96 + 32 i on sits at the target's start (a new delta each time,
            # so an earlier target, now a donor too, never offers a delta-0 prefix)
            start = 96 + 32 * i
            target = donor[: n - n // 20] + tail if mode == "exact" else donor[start : start + n - n // 20] + tail
            r = h.run_request(target, capture_kv=False)
            promised.append(r.promised)
        worker_ms = statistics.median(times) * 1e3
        moved = statistics.median(promised) * bytes_per_token * 2  # read + write
        pool = h.worker.pool
        assert pool is not None
        half = pool.shape[0] // 2
        nb = int(statistics.median(promised)) // bs
        src = torch.arange(nb, device=pool.device)
        dst = torch.arange(half, half + nb, device=pool.device)
        copy_times: list[float] = []
        copy = _timed(lambda p=pool, d=dst, s=src: p.index_copy_(0, d, p.index_select(0, s)), copy_times, sync)
        for _ in range(args.repeats):
            copy()
        raw = pool[half : half + nb]
        flat_times: list[float] = []
        flat = _timed(lambda r=raw, p=pool, k=nb: r.copy_(p[:k]), flat_times, sync)
        for _ in range(args.repeats):
            flat()
        flat_ms = statistics.median(flat_times) * 1e3
        print(
            f"{mode:8s} promised={int(statistics.median(promised))} worker start_load_kv p50={worker_ms:.3f} ms "
            f"({moved / worker_ms / 1e6:.0f} GB/s); contiguous copy of the same bytes {flat_ms:.3f} ms "
            f"({moved / flat_ms / 1e6:.0f} GB/s); index_select+index_copy {statistics.median(copy_times) * 1e3:.3f} ms; "
            f"worker / contiguous copy = {worker_ms / flat_ms:.2f}x"
        )
        if args.profile and cuda:
            tail = _prompt(999, n // 20)
            target = donor[: n - n // 20] + tail if mode == "exact" else donor[64 : 64 + n - n // 20] + tail
            timed_load = h.worker.start_load_kv

            def profiled(*a: Any, _load: Callable[..., Any] = timed_load, **k: Any) -> Any:
                acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                with torch.profiler.profile(activities=acts) as prof:
                    out = _load(*a, **k)
                print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))
                return out

            h.worker.start_load_kv = profiled  # type: ignore[method-assign]
            h.run_request(target, capture_kv=False)


if __name__ == "__main__":
    main()
