"""Routing-path latency of ``DonorDiscovery.discover`` for an 8K-token prompt: spans only vs embeddings enabled.

Donors: up to 64 prompts of 1,024 tokens cut from the bundled corpus (49 with the bundled corpus), registered (and embedded) before timing. Target:
8 of those donors' texts in another order (8,192 tokens), so the plan has shifted spans and the embedding
stage runs (an accepted exact-equivalent plan would skip it). Shifted mode with cache-salt isolation.

Cases, same run and same pipeline:
* spans only (``embed=False``): exact check + alignment + plan;
* embeddings enabled, bounded: ``max_embed_windows`` (default 4) windows of 256 tokens embedded on the path;
* baseline: the whole prompt embedded (every window, as a naive pipeline would do).

Usage: ``.venv/bin/python benchmarks/bench_routing_path.py [--embedder minilm|hash]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time

import numpy as np

from semblend_apps.replay.runner import load_embedder
from semblend_apps.replay.workload import load_corpus
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.pipeline import DiscoveryResult, DonorDiscovery
from semblend_dynamo.tokenizer import TokenizerAdapter


def pipeline(cfg: SemblendConfig, tokenizer: TokenizerAdapter, notices: list[str]) -> DonorDiscovery:
    embedder = load_embedder(cfg, notices)
    return DonorDiscovery.from_config(cfg, embedder=embedder, tokenizer=tokenizer, background=False)


def timed(discovery: DonorDiscovery, ns: NamespaceKey, target: list[int], n: int, embed: bool) -> list[DiscoveryResult]:
    discovery.discover("warm-up", ns, target, embed=embed)
    return [discovery.discover(f"r{i}", ns, target, embed=embed) for i in range(n)]


def stats(results: list[DiscoveryResult], stage: str) -> tuple[float, float]:
    values = np.array([getattr(r.timings_us, stage) for r in results]) / 1000.0
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedder", choices=["minilm", "hash"], default="minilm")
    parser.add_argument("--iterations", type=int, default=20, help="timed calls with embeddings (spans only: 10x)")
    parser.add_argument("--baseline-iterations", type=int, default=3)
    args = parser.parse_args()

    tokenizer = TokenizerAdapter.bundled()
    docs = [tokenizer.encode(d.text) for d in load_corpus()]
    chunks = [d[i : i + 1024] for d in docs for i in range(0, len(d) - 1024, 1024)][:64]
    rng = random.Random(0)
    picked = rng.sample(range(len(chunks)), 8)
    target = [t for i in picked for t in chunks[i]]
    base = {"embedder": args.embedder, "exact_materialization_only": False, "isolation": "cache_salt"}
    cfg = SemblendConfig(**base)
    notices: list[str] = []
    bounded = pipeline(cfg, tokenizer, notices)
    full = pipeline(SemblendConfig(**base, max_embed_windows=256), tokenizer, notices)
    ns = NamespaceKey(model_id=cfg.model_id, tokenizer_fingerprint=tokenizer.fingerprint, tokens_per_block=32)
    t0 = time.perf_counter()
    for i, chunk in enumerate(chunks):
        bounded.register_donor(f"d{i}", ns, chunk)
    register_s = time.perf_counter() - t0
    for i, chunk in enumerate(chunks):
        full.register_donor(f"d{i}", ns, chunk)

    spans_only = timed(bounded, ns, target, 10 * args.iterations, embed=False)
    with_embed = timed(bounded, ns, target, args.iterations, embed=True)
    whole = timed(full, ns, target, args.baseline_iterations, embed=True)

    check = with_embed[-1]
    windows = len(bounded.segmenter.windows(len(target)))
    embedder_name = getattr(bounded.embedder, "name", "?")
    print(f"host: {platform.machine()}, python {platform.python_version()}, embedder {embedder_name}")
    print(f"cpus: {os.cpu_count()}, load average (1/5/15 min) at the end: {os.getloadavg()}")
    for notice in notices:
        print(f"notice: {notice}")
    print(
        f"donors: {len(chunks)} x 1024 tokens (registered+embedded in {register_s:.1f} s, "
        f"{register_s / len(chunks) * 1000:.0f} ms/donor, off the routing path); target {len(target)} tokens, "
        f"{windows} windows of {cfg.window_tokens}; plan: {check.decision.reason or 'accepted'}, "
        f"{len(check.spans)} spans, similarity {check.best_similarity}"
    )
    print(f"{'case':<46}{'total p50 ms':>13}{'p99 ms':>9}{'embed p50':>11}{'align p50':>11}{'n':>5}")
    for name, results in (
        ("spans only (embed=False)", spans_only),
        (f"embeddings, bounded ({cfg.max_embed_windows} windows)", with_embed),
        (f"baseline: whole prompt embedded ({windows} windows)", whole),
    ):
        p50, p99 = stats(results, "total")
        e50, _ = stats(results, "embed")
        a50, _ = stats(results, "align")
        print(f"{name:<46}{p50:>13.2f}{p99:>9.2f}{e50:>11.2f}{a50:>11.3f}{len(results):>5}")
    s50 = stats(spans_only, "total")[0]
    b50 = stats(with_embed, "total")[0]
    w50 = stats(whole, "total")[0]
    print(f"bounded embedding vs whole prompt: {w50 / b50:.1f}x faster; spans only vs bounded: {b50 / s50:.0f}x faster")


if __name__ == "__main__":
    main()
