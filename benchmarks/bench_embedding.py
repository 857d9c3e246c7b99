#!/usr/bin/env python3
"""Embedding latency: MiniLM through ONNX Runtime (fp32 and per-channel int8) vs the hash fallback, same run.

Cases: one 256-token window; an 8K-token prompt (bundled tokenizer) cut into 256-token windows with 32 overlap and
embedded in full (donor registration, off the critical path); the same prompt's bounded sample of
``max_embed_windows`` windows (what the routing path embeds). Also the one-time graph build (cold cache).

Usage: .venv/bin/python benchmarks/bench_embedding.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from semblend_dynamo.embedder import Embedder, HashEmbedder, embed_token_windows
from semblend_dynamo.embedder.minilm import MiniLMEmbedder, default_cache_dir
from semblend_dynamo.segmenter import WindowSegmenter
from semblend_dynamo.tokenizer import TokenizerAdapter, bundled_tokenizer_path


def timed(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    fn()  # warm-up
    samples = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return float(np.percentile(samples, 50)), float(np.percentile(samples, 99))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke run)")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: all cores)")
    parser.add_argument("--max-embed-windows", type=int, default=4)
    args = parser.parse_args()
    reps_window, reps_prompt = (5, 2) if args.quick else (40, 8)

    with tempfile.TemporaryDirectory() as cold:
        start = time.perf_counter()
        MiniLMEmbedder(cache_dir=Path(cold))
        cold_build_s = time.perf_counter() - start

    tok = TokenizerAdapter.bundled()
    corpus = bundled_tokenizer_path().parent / "corpus"
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(corpus.glob("*.txt"))[:6])
    ids = tok.encode(text)[:8192]
    assert len(ids) == 8192, "corpus too small for an 8K prompt"
    segmenter = WindowSegmenter(256, 32)
    windows = segmenter.windows(len(ids))
    sample = segmenter.sample(windows, args.max_embed_windows)

    embedders: list[Embedder] = [HashEmbedder()]
    for precision in ("fp32", "int8"):
        embedders.append(
            MiniLMEmbedder(cache_dir=default_cache_dir(), precision=precision, intra_op_threads=args.threads)  # type: ignore[arg-type]
        )
    minilm = embedders[1]
    assert isinstance(minilm, MiniLMEmbedder)
    # a window of exactly 256 MiniLM tokens ([CLS] + 254 + [SEP]); longer text is truncated to it
    window_text = tok.decode(ids[:400])
    assert minilm.token_count(window_text) == 256

    print(f"# embedding, {platform.machine()}, {os.cpu_count()} CPUs, ORT threads {args.threads or 'all'}")
    print(f"# cold start: building the MiniLM ONNX graph from safetensors + ORT fusion took {cold_build_s:.1f} s")
    print(f"# 8K prompt = {len(windows)} windows of 256 tokens (overlap 32); routing sample = {len(sample)} windows")
    rows = []
    for emb in embedders:
        w = timed(lambda e=emb: e.embed([window_text]), reps_window)
        full = timed(lambda e=emb: embed_token_windows(e, tok, ids, windows), reps_prompt)
        part = timed(lambda e=emb: embed_token_windows(e, tok, ids, sample), reps_window)
        rows.append((emb.name, w, full, part))
        print(f"  {emb.name}: window {w[0]:.2f} ms, 8K full {full[0]:.0f} ms, 8K sample {part[0]:.1f} ms", flush=True)

    base = rows[0]
    fp32 = rows[1]
    print()
    print("| embedder | 256-token window p50 / p99 ms | 8K prompt, all windows p50 / p99 ms | "
          f"8K prompt, {len(sample)}-window sample p50 / p99 ms | window vs hash | window vs MiniLM fp32 |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name, w, full, part in rows:
        print(
            f"| {name} | {w[0]:.2f} / {w[1]:.2f} | {full[0]:.0f} / {full[1]:.0f} | {part[0]:.1f} / {part[1]:.1f} | "
            f"{w[0] / base[1][0]:.0f}x | {w[0] / fp32[1][0]:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
