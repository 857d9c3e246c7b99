"""The router's added latency over an exact-only router, in-process, with 100K resident donors.

Two ``SemanticRouter`` instances in one process, one event loop, the same Dynamo ``KvRouter`` stand-in (answers
overlap/load queries from tables and streams one response at once, so only the router's own work is timed) and the
same requests (8,192-token prompts):

* ``semantic``: ``SEMBLEND_ENABLED=1``, N donors of 512 tokens registered through its ``DonorCatalog`` and resident
  (their blocks applied as kv-events); the request path is the production one (spans on the loop, embeddings on the
  embedding worker within ``SEMBLEND_EMBED_BUDGET_MS``);
* ``exact-only`` (the baseline): ``SEMBLEND_ENABLED=0``.

Latency = ``generate()`` call to its first response. Cases: sequential span-path requests (each reorders 8 donors
among random tokens); then 200 concurrent requests, half span-path and half sharing nothing with any donor (so they
need an embedding), against 200 concurrent span-path requests on the exact-only router.

The stock Frontend in front is not part of this measurement: `benchmarks/frontend_path/run.py` measures through it.

Usage: ``.venv/bin/python benchmarks/bench_router_loop.py [--donors 100000] [--embedder hash|minilm]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from dynamo.llm import compute_block_hash_for_seq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from semblend_dynamo.config import SemblendConfig  # noqa: E402
from semblend_dynamo.events.link import NatsLink  # noqa: E402
from semblend_dynamo.events.publisher import EvidencePublisher  # noqa: E402
from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored  # noqa: E402
from semblend_dynamo.namespace import NamespaceKey  # noqa: E402
from semblend_dynamo.router.__main__ import build_discovery  # noqa: E402
from semblend_dynamo.router.catalog import DonorCatalog  # noqa: E402
from semblend_dynamo.router.handler import SemanticRouter  # noqa: E402
from semblend_dynamo.router.metrics import RouterMetrics  # noqa: E402

BLOCK = 32
DONOR_TOKENS = 512
TARGET_TOKENS = 8192
WORKER = 0x1234
CONCURRENT = 200


class KvRouterStandIn:
    """Dynamo's KvRouter as the router sees it, answering at once: no exact overlap, one idle worker."""

    async def get_overlap_scores(self, token_ids: list[int], **_: Any) -> dict[str, Any]:
        return {"workers": [{"worker_id": WORKER, "dp_rank": 0, "device_blocks": 0}]}

    async def get_potential_loads(self, token_ids: list[int]) -> list[dict[str, int]]:
        return [{"worker_id": WORKER, "dp_rank": 0, "active_requests": 0}]

    async def generate_from_request(self, request: dict[str, Any]) -> Any:
        async def stream() -> Any:
            yield {"token_ids": [1], "routing_data": {"worker_id": {"decode_worker_id": WORKER, "decode_dp_rank": 0}}}

        return stream()

    async def dump_events(self) -> str:
        return "[]"


class LinkStandIn(NatsLink):
    """Connected, publishing nowhere (evidence is queued and drained as in production, minus the socket)."""

    @property
    def connected(self) -> bool:
        return True

    async def publish(self, subject: str, data: bytes, *, reply: str = "") -> None:
        return None


def make_router(cfg: SemblendConfig) -> SemanticRouter:
    link = LinkStandIn(cfg, name="bench")
    discovery = build_discovery(cfg)
    publisher = EvidencePublisher(link, queue_size=1 << 16)
    publisher.start()
    return SemanticRouter(
        cfg,
        kv_router=KvRouterStandIn(),
        discovery=discovery,
        catalog=DonorCatalog(cfg.index_capacity, discovery),
        link=link,
        publisher=publisher,
        metrics=RouterMetrics(),
        namespace_of=lambda lora, salt: NamespaceKey(model_id=cfg.model_id, tokens_per_block=BLOCK, cache_salt=salt),
        deployment="bench",
    )


def add_donors(router: SemanticRouter, donors: np.ndarray, dim: int, rng: np.random.Generator) -> float:
    t0 = time.perf_counter()
    ns = router.parse({"token_ids": [1]}).namespace
    vectors = rng.standard_normal((len(donors), dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for i, tokens in enumerate(donors.tolist()):
        hashes = compute_block_hash_for_seq(tokens, BLOCK)
        embedding, edim = DonorRegistration.pack_embedding(vectors[i])
        registration = DonorRegistration(
            donor_id=f"d{i}",
            worker_id=WORKER,
            deployment="bench",
            namespace=ns.digest(),
            num_tokens=DONOR_TOKENS,
            block_size=BLOCK,
            block_hashes=hashes,
            embedding=embedding,
            embedding_dim=edim,
        )
        router.catalog.add(registration, local=(ns, tokens))
        stored = KvStored([(i << 8) + j for j in range(len(hashes))], hashes)
        router.catalog.apply_kv_events([KvEvent(WORKER, i + 1, stored)])
    return time.perf_counter() - t0


async def first_response_ms(router: SemanticRouter, tokens: list[int]) -> float:
    t0 = time.perf_counter()
    elapsed = None
    async for _ in router.generate({"token_ids": tokens}):  # read to the end: the decision is recorded there
        elapsed = elapsed if elapsed is not None else (time.perf_counter() - t0) * 1e3
    assert elapsed is not None
    return elapsed


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def run(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(7)
    settings = {"block_size": BLOCK, "embedder": args.embedder, "min_span_tokens": 64, "min_donor_tokens": 1 << 20}
    semantic_cfg = SemblendConfig(**settings, index_capacity=max(args.donors, 100_000))
    exact_cfg = SemblendConfig(**settings, enabled=False)
    semantic, exact = make_router(semantic_cfg), make_router(exact_cfg)
    assert semantic.discovery is not None and semantic.discovery.embedder is not None
    donors = rng.integers(100, 7000, size=(args.donors, DONOR_TOKENS), dtype=np.int64)
    setup_s = add_donors(semantic, donors, semantic.discovery.embedder.dim, rng)
    assert len(semantic.catalog) == args.donors == len(semantic.discovery)
    gc.collect()
    gc.freeze()  # the 100K donors' objects are long-lived: keep them out of every later collection

    def span_target() -> list[int]:
        picks = rng.choice(args.donors, size=8, replace=False)
        filler = rng.integers(7000, 9000, size=TARGET_TOKENS - 8 * DONOR_TOKENS).tolist()
        return filler[:2048] + [t for i in picks[::-1] for t in donors[i].tolist()] + filler[2048:]

    def unrelated() -> list[int]:
        return rng.integers(7000, 9000, size=TARGET_TOKENS).tolist()

    targets = [span_target() for _ in range(args.requests)]
    for router in (semantic, exact):  # warm-up
        await first_response_ms(router, targets[0])
    seq: dict[str, list[float]] = {"semantic": [], "exact": []}
    for tokens in targets:  # interleaved, so both see the same machine load
        seq["semantic"].append(await first_response_ms(semantic, tokens))
        seq["exact"].append(await first_response_ms(exact, tokens))
    placements = semantic.metrics.decisions.labels("semantic_placement")._value.get()

    burst_span = [span_target() for _ in range(CONCURRENT // 2)]
    burst_embed = [unrelated() for _ in range(CONCURRENT // 2)]
    conc_sem = await asyncio.gather(*(first_response_ms(semantic, t) for t in [*burst_embed, *burst_span]))
    conc_exact = await asyncio.gather(*(first_response_ms(exact, t) for t in [*burst_span, *burst_span]))
    embed_results = {r: semantic.metrics.embeddings.labels(r)._value.get() for r in ("ok", "budget", "queue_full")}

    print(
        f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}"
    )
    print(f"# donors {args.donors:,} (512 tokens, all resident), setup {setup_s:.0f} s, embedder {args.embedder}")
    print(f"# embed budget {semantic_cfg.embed_budget_ms} ms, queue {semantic_cfg.embed_queue_size}")
    print()
    print(
        "| case | semantic p50 ms | semantic p99 ms | exact-only p50 ms | exact-only p99 ms | added p50 | added p99 |"
    )
    print("|---|---|---|---|---|---|---|")
    s, e = seq["semantic"], seq["exact"]
    print(
        f"| sequential, span path ({args.requests} requests, {placements:.0f} placed) | {pct(s, 50):.3f} | "
        f"{pct(s, 99):.3f} | {pct(e, 50):.3f} | {pct(e, 99):.3f} | {pct(s, 50) - pct(e, 50):.3f} | "
        f"{pct(s, 99) - pct(e, 99):.3f} |"
    )
    emb, span = list(conc_sem[: CONCURRENT // 2]), list(conc_sem[CONCURRENT // 2 :])
    print(
        f"| {CONCURRENT} concurrent: the {CONCURRENT // 2} span-path requests | {pct(span, 50):.3f} | "
        f"{pct(span, 99):.3f} | {pct(conc_exact, 50):.3f} | {pct(conc_exact, 99):.3f} | "
        f"{pct(span, 50) - pct(conc_exact, 50):.3f} | {pct(span, 99) - pct(conc_exact, 99):.3f} |"
    )
    print(
        f"| {CONCURRENT} concurrent: the {CONCURRENT // 2} needing an embedding | {pct(emb, 50):.3f} | "
        f"{pct(emb, 99):.3f} | {pct(conc_exact, 50):.3f} | {pct(conc_exact, 99):.3f} | "
        f"{pct(emb, 50) - pct(conc_exact, 50):.3f} | {pct(emb, 99) - pct(conc_exact, 99):.3f} |"
    )
    print()
    print(f"embeddings for the {CONCURRENT // 2} requests without spans: {embed_results}")
    assert semantic.embeddings is not None
    semantic.embeddings.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--embedder", choices=["hash", "minilm"], default="hash")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
