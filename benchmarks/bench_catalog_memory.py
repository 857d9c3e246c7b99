"""Router replica memory per resident donor: the catalog, residency, and the discovery pipeline's embedding index.

Registers ``N`` donors as peer registrations arrive at a replica (``DonorCatalog.add``: 512-token donors of 32-token
blocks, 16 Dynamo block hashes each, a 384-d float16 embedding, spread over 64 workers), stores every donor's
blocks through kv-events so all of them are resident (the worker block maps are part of what a replica holds), and
reports the process's RSS growth per donor, once the pipeline's indexer thread has indexed them all, against the empty
replica measured in the same run (usearch's native index included; also after glibc's ``malloc_trim``, which returns
freed heap pages, and then with the block maps' rewrites settled and trimmed as the router's loop does) and, with
``--trace``, the Python heap's (``tracemalloc``). Each size runs in a fresh process.

Usage: ``python -m benchmarks.bench_catalog_memory --donors 100000 [--trace] [--index-dtype f16]``
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import resource
import sys
import time
import tracemalloc

import numpy as np

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.donor_index import VectorDtype
from semblend_dynamo.embedder import HashEmbedder
from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored
from semblend_dynamo.pipeline import DonorDiscovery
from semblend_dynamo.router.catalog import DonorCatalog

WORKERS = 64
BLOCKS = 16
DIM = 384
CHUNK = 10_000


def registrations(n: int, seed: int = 0, first: int = 0) -> list[DonorRegistration]:
    rng = np.random.default_rng(seed)
    hashes = rng.integers(1, 1 << 63, size=(n, BLOCKS), dtype=np.int64)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    out = []
    for i in range(n):
        embedding, dim = DonorRegistration.pack_embedding(vectors[i])
        out.append(
            DonorRegistration(
                donor_id=f"w{(first + i) % WORKERS}-donor-{first + i:08d}",
                router_id="router-a",
                worker_id=(first + i) % WORKERS,
                deployment="d" * 16,
                namespace="n" * 16,
                num_tokens=BLOCKS * 32,
                block_size=32,
                block_hashes=hashes[i].tolist(),
                embedding=embedding,
                embedding_dim=dim,
            )
        )
    return out


def rss_bytes() -> int:
    """Resident set size now (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def fill(catalog: DonorCatalog, n: int, *, one_by_one: bool = True) -> list[str]:
    """Register ``n`` donors with ``catalog`` (one by one, as peer registrations arrive, or a chunk at a time) and store
    every donor's blocks through kv-events, generated a chunk at a time and dropped after (as a replica decodes and
    drops messages); a sample of the donor ids, ~100 a chunk."""
    next_block = [0] * WORKERS
    ids: list[str] = []
    for first in range(0, n, CHUNK):
        regs = registrations(min(CHUNK, n - first), seed=first, first=first)
        if one_by_one:
            for r in regs:
                catalog.add(r)
        else:
            catalog.add_many(regs)
        events = []
        for r in regs:
            w = r.worker_id
            blocks = list(range(next_block[w], next_block[w] + BLOCKS))
            next_block[w] += BLOCKS
            events.append(KvEvent(worker_id=w, event_id=next_block[w] // BLOCKS, data=KvStored(blocks, r.block_hashes)))
        catalog.apply_kv_events(events)
        ids += [r.donor_id for r in regs[:: max(1, len(regs) // 100)]]
        del regs, events
    return ids


def measure(n: int, *, trace: bool, index_dtype: VectorDtype = "i8") -> dict[str, object]:
    """Register ``n`` donors (generated in chunks and dropped after, as a replica decodes and drops messages), store
    their blocks through kv-events, and report memory per donor against the empty replica."""
    gc.collect()
    if trace:
        tracemalloc.start()
    cfg = SemblendConfig(index_capacity=n + 16, index_dtype=index_dtype)
    discovery = DonorDiscovery.from_config(cfg, embedder=HashEmbedder(), background=False)
    catalog = DonorCatalog(n + 16, discovery)
    gc.collect()
    empty_rss, empty_heap = rss_bytes(), tracemalloc.get_traced_memory()[0] if trace else 0
    started = time.perf_counter()
    ids = fill(catalog, n)
    catalog.drain()  # the indexer thread indexes behind the registrations: measure the replica once it caught up
    seconds = time.perf_counter() - started
    gc.collect()
    heap = (tracemalloc.get_traced_memory()[0] - empty_heap) / n if trace else float("nan")
    if trace:
        tracemalloc.stop()
    rss = rss_bytes()
    ctypes.CDLL(None).malloc_trim(0)  # glibc: what of the growth is freed heap (messages, dropped embeddings) kept
    trimmed = rss_bytes()
    while (settled := catalog.settle_maps(1 << 16)) is None or settled[1]:  # as the router's loop settles the maps
        pass
    ctypes.CDLL(None).malloc_trim(0)
    settled_rss = rss_bytes()
    catalog.close()
    return {
        "donors": n,
        "index_dtype": index_dtype,
        "sampled_resident": sum(catalog.is_resident(d) for d in ids) / len(ids),
        "empty_replica_rss_mb": empty_rss / 2**20,
        "rss_bytes_per_donor": (rss - empty_rss) / n,
        "rss_bytes_per_donor_after_malloc_trim": (trimmed - empty_rss) / n,
        "rss_bytes_per_donor_settled": (settled_rss - empty_rss) / n,
        "python_heap_bytes_per_donor": heap,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", default="10000,100000")
    parser.add_argument("--trace", action="store_true", help="also count Python heap bytes (tracemalloc; slower)")
    parser.add_argument("--index-dtype", default="i8", choices=("f16", "i8"), help="the search index's vector storage")
    args = parser.parse_args(argv)
    for n in (int(x) for x in args.donors.split(",")):
        row = measure(n, trace=args.trace, index_dtype=args.index_dtype)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
