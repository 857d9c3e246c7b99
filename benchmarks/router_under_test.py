"""A ``SemanticRouter`` with resident donors and Dynamo stand-ins, for the in-process router benchmarks.

Shared by ``bench_donor_churn.py`` and ``bench_route_decision.py``. Both run a child process on the code of a git ref
or of this tree: :func:`use_code` puts that code first on the path, and everything here imports ``semblend_dynamo``
only when called, so it is that code's router that is built and timed.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 32
DONOR_TOKENS = 512
TARGET_TOKENS = 8192
WORKER = 0x1234
SEED_CHUNK = 1024
"""Donors registered between waits for the router's indexer (it queues a bounded number of prompts)."""


def use_code(code: str) -> None:
    """Import ``semblend_dynamo`` from the tree at ``code`` (checked)."""
    sys.path.insert(0, str(Path(code).resolve()))
    import semblend_dynamo

    assert Path(semblend_dynamo.__file__).resolve().is_relative_to(Path(code).resolve())


def export_ref(ref: str, into: str) -> None:
    """The tree of git ``ref`` of this repository, extracted into ``into``, with its span aligner's compiled core built
    (git does not hold the library: without it the baseline would run the numpy aligner)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    native = Path(into) / "semblend_dynamo" / "_native"
    if (native / "build.py").exists():
        # cwd first on sys.path: the exported package builds its own span_aligner.c into its own folder
        subprocess.run(
            [sys.executable, "-m", "semblend_dynamo._native", "build"], cwd=into, capture_output=True, check=True
        )
        assert any(native.glob("*.so")), f"{ref}: the span aligner's library was not built"


def make_router(cfg: Any, *, loop_turns: bool, runtime_s: float = 0.0) -> Any:
    """A router whose Dynamo KvRouter is a stand-in (no exact overlap, one idle worker) and whose NATS link is
    connected and publishes nowhere; ``loop_turns``: the stand-in's queries and stream each take one loop turn, as an
    awaited call into Dynamo's runtime does. ``runtime_s`` > 0: they are answered as Dynamo's runtime answers
    instead (:class:`RuntimeStandIn`), ``runtime_s`` after they are asked."""
    from semblend_dynamo.events.link import NatsLink
    from semblend_dynamo.events.publisher import EvidencePublisher
    from semblend_dynamo.namespace import NamespaceKey
    from semblend_dynamo.router.__main__ import build_discovery
    from semblend_dynamo.router.catalog import DonorCatalog
    from semblend_dynamo.router.handler import SemanticRouter
    from semblend_dynamo.router.metrics import RouterMetrics

    async def turn() -> None:
        if loop_turns:
            await asyncio.sleep(0)

    def overlap() -> dict[str, Any]:
        return {"workers": [{"worker_id": WORKER, "dp_rank": 0, "device_blocks": 0}]}

    def loads() -> list[dict[str, int]]:
        return [{"worker_id": WORKER, "dp_rank": 0, "active_requests": 0}]

    async def stream() -> Any:
        await turn()
        yield {"token_ids": [1], "routing_data": {"worker_id": {"decode_worker_id": WORKER}}}

    class KvRouterStandIn:
        """Dynamo's KvRouter as the router sees it."""

        async def get_overlap_scores(self, token_ids: list[int], **_: Any) -> dict[str, Any]:
            await turn()
            return overlap()

        async def get_potential_loads(self, token_ids: list[int]) -> list[dict[str, int]]:
            return loads()

        async def generate_from_request(self, request: dict[str, Any]) -> Any:
            return stream()

        async def dump_events(self) -> str:
            return "[]"

    class KvRouterOnRuntime(KvRouterStandIn):
        """The same answers, each from :class:`RuntimeStandIn`."""

        def __init__(self) -> None:
            self.runtime = RuntimeStandIn(runtime_s)

        def get_overlap_scores(self, token_ids: list[int], **_: Any) -> Any:  # type: ignore[override]
            return self.runtime.ask(token_ids, overlap)

        def get_potential_loads(self, token_ids: list[int]) -> Any:  # type: ignore[override]
            return self.runtime.ask(token_ids, loads)

        def generate_from_request(self, request: dict[str, Any]) -> Any:  # type: ignore[override]
            return self.runtime.ask(request["token_ids"], stream)

    class LinkStandIn(NatsLink):
        """Connected, publishing nowhere."""

        @property
        def connected(self) -> bool:
            return True

        async def publish(self, subject: str, data: bytes, *, reply: str = "") -> None:
            return None

    link = LinkStandIn(cfg, name="bench")
    discovery = build_discovery(cfg)
    publisher = EvidencePublisher(link, queue_size=1 << 16)
    publisher.start()
    return SemanticRouter(
        cfg,
        kv_router=KvRouterOnRuntime() if runtime_s > 0 else KvRouterStandIn(),
        discovery=discovery,
        catalog=DonorCatalog(cfg.index_capacity, discovery),
        link=link,
        publisher=publisher,
        metrics=RouterMetrics(),
        namespace_of=lambda lora, salt: NamespaceKey(model_id=cfg.model_id, tokens_per_block=BLOCK, cache_salt=salt),
        deployment="bench",
    )


class RuntimeStandIn:
    """Dynamo's runtime as its Python bindings behave: a call copies its token ids (pyo3 converts the list) and
    returns an asyncio future at once; the query runs on another thread, which builds the answer (holding the GIL)
    ``latency_s`` later and hands it to the loop with ``call_soon_threadsafe``."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="runtime-stand-in")

    def ask(self, token_ids: list[int], answer: Callable[[], Any]) -> asyncio.Future[Any]:
        array("I", token_ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        deadline = time.perf_counter() + self.latency_s

        def run() -> None:
            time.sleep(max(0.0, deadline - time.perf_counter()))
            value = answer()
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(value))

        self.threads.submit(run)
        return future


async def seed(router: Any, n: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """``n`` random donors of ``DONOR_TOKENS`` registered as served on the stand-in worker and made resident through
    kv-events, as the router does for finished requests, once its pipeline holds all of them (then collected and
    frozen, as a long-running router's old objects are). Returns the donors' tokens and the seconds it took."""
    from dynamo.llm import compute_block_hash_for_seq

    from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored

    donors = rng.integers(100, 7000, size=(n, DONOR_TOKENS), dtype=np.int64)
    t0 = time.perf_counter()
    assert router.discovery is not None and router.discovery.embedder is not None
    vectors = rng.standard_normal((len(donors), router.discovery.embedder.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    namespace = router.parse({"token_ids": [1]}).namespace
    for i, tokens in enumerate(donors.tolist()):
        hashes = compute_block_hash_for_seq(tokens, BLOCK)
        embedding, dim = DonorRegistration.pack_embedding(vectors[i])
        registration = DonorRegistration(
            donor_id=f"d{i}",
            worker_id=WORKER,
            deployment="bench",
            namespace=namespace.digest(),
            num_tokens=DONOR_TOKENS,
            block_size=BLOCK,
            block_hashes=hashes,
            embedding=embedding,
            embedding_dim=dim,
        )
        router.catalog.add(registration, local=(namespace, tokens))
        stored = KvStored([(i << 8) + j for j in range(len(hashes))], hashes)
        router.catalog.apply_kv_events([KvEvent(WORKER, i + 1, stored)])
        if i % SEED_CHUNK == SEED_CHUNK - 1:
            await router.drain_registrations(timeout=3600)
    await router.drain_registrations(timeout=3600)
    assert len(router.catalog) == len(donors) == len(router.discovery)
    seconds = time.perf_counter() - t0
    gc.collect()
    gc.freeze()
    return donors, seconds


async def span_path_router(donors: int) -> tuple[Any, np.ndarray, np.random.Generator]:
    """A router of :func:`make_router` (hash embedder, 64-token spans, index for 100K, finished prompts not made
    donors, no loop turns) with ``donors`` seeded donors: the router, their tokens, and the generator (seed 7) to draw
    prompts from (:func:`span_target`)."""
    from semblend_dynamo.config import SemblendConfig

    cfg = SemblendConfig(
        block_size=BLOCK,
        embedder="hash",
        min_span_tokens=64,
        min_donor_tokens=TARGET_TOKENS + 1,
        index_capacity=100_000,
    )
    router = make_router(cfg, loop_turns=False)
    rng = np.random.default_rng(7)
    tokens, _ = await seed(router, donors, rng)
    return router, tokens, rng


def span_target(rng: np.random.Generator, donors: np.ndarray) -> list[int]:
    """An 8,192-token prompt holding 8 donors in reverse order among random tokens (no exact prefix)."""
    picks = rng.choice(len(donors), size=8, replace=False)
    filler = rng.integers(7000, 9000, size=TARGET_TOKENS - 8 * DONOR_TOKENS).tolist()
    return filler[:2048] + [t for i in picks[::-1] for t in donors[i].tolist()] + filler[2048:]
