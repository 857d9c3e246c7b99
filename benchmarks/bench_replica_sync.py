"""Late-replica convergence: how long a router replica started late takes to hold its peer's donors.

A real nats-server on 127.0.0.1 (its default 1 MB max payload) and two router replicas, each its own process, wired as
``semblend_dynamo.router.__main__`` wires them (``tests/adversarial/router_harness.InProcessRouter``: the real
handler, catalog, pipeline, codec and NATS link; only Dynamo's KvRouter is a test double):

* replica A holds ``N`` resident donors: registrations as ``benchmarks/bench_catalog_memory.py`` generates them
  (512-token donors of 32-token blocks, 16 Dynamo block hashes, a 384-d float16 embedding, 64 workers, here over 4
  namespaces) added as peer registrations arrive, and every donor's blocks stored through kv-events;
* replica B starts late: it first recovers the workers' blocks as a late replica does from Dynamo's KV index
  (``DonorCatalog.merge_dump``, timed apart), then connects, asks its peers for their donors, and is timed from the
  connect until it holds A's donor count and resident count; then (untimed) its whole catalog (ids, workers,
  namespaces, block counts and residency, ``DonorCatalog.snapshot``) must equal A's, or the run fails.

``--index`` is replica B's donor search index (``none``: semantic search off, the catalog only; ``numpy``/``usearch``:
the pipeline indexes every resident donor's embedding on its indexer thread, behind the sync). With an index, B is
also timed until its indexer has applied everything (the index caught up), and reports how many resident donors the
index holds and how many adds the indexer dropped. Replica A indexes nothing unless ``--peer-index``: then it builds the
same index of its donors before B starts (timed apart), and B, whose index is empty, loads A's saved whole
(``router/index_sync.py``) unless ``--snapshots off``; ``--snapshots on off`` runs one late replica of each against
the same A. Replica A's RSS is reported once filled, once settled (before any late replica) and
``PEER_QUIET_S`` after each late replica is done (after serving it). Both replicas bound their heap as the router
does (``router/heap.py``), at the config's ``heap_top_mib`` unless ``--heap-top-mib`` (0: glibc's adaptive thresholds).
The baseline is the same measurement on the tree of ``--baseline-ref`` (the one-registration-per-row v1 sync,
``git archive``d to a temporary directory), in the same run.

``--breakdown N`` instead times, in one process, where the CPU of a sync of ``N`` donors goes per donor (the peer
building pages; the late replica decoding them, taking their rows as columns, holding them and adding them several
pages at a time as the handler does, ``router/sync.py`` ``HeldPages``), with Python's GC on, on but off during each
add and what is alive frozen after it as the handler does (``router/gc_freeze.py``), and off.

Usage: ``.venv/bin/python benchmarks/bench_replica_sync.py [--donors 10000 100000 300000 1000000]
[--baseline-donors 10000] [--index none|numpy|usearch] [--indexer-batch N] [--peer-index] [--snapshots on off]`` or ``... --breakdown 300000``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from router_under_test import export_ref

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 64
BLOCKS = 16
BLOCK_SIZE = 32
DIM = 384
CHUNK = 10_000
NAMESPACES = tuple(f"{c}" * 16 for c in "abcd")
PEER_QUIET_S = 3.0
"""How long after the late replica is done replica A's RSS is read (it trims its heap 1 s after the last request)."""
BASELINE_REF = "6d217e2"
"""The last commit with the v1 sync (``semblend.syncpage/v1``: up to 256 pydantic registrations a page, 20/s)."""


def rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


# --- the fleet's data (the same in both processes, chunk by chunk) ----------------------------------------------
def chunk_hashes(first: int, count: int) -> tuple[np.random.Generator, np.ndarray]:
    rng = np.random.default_rng([7, first])
    return rng, rng.integers(1, 1 << 63, size=(count, BLOCKS), dtype=np.int64)


def block_events(first: int, count: int, hashes: np.ndarray) -> list[Any]:
    """Every donor's blocks stored on its worker (engine block ids unique across the fleet)."""
    from semblend_dynamo.events.schemas import KvEvent, KvStored

    return [
        KvEvent(
            (first + i) % WORKERS,
            (first + i) // WORKERS + 1,
            KvStored(list(range((first + i) * BLOCKS, (first + i + 1) * BLOCKS)), hashes[i].tolist()),
        )
        for i in range(count)
    ]


def registrations(first: int, count: int, deployment: str) -> tuple[list[Any], np.ndarray]:
    from semblend_dynamo.events.schemas import DonorRegistration

    rng, hashes = chunk_hashes(first, count)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    embeddings = vectors.astype("<f2")
    out = [
        DonorRegistration.model_construct(
            donor_id=f"w{(first + i) % WORKERS}-donor-{first + i:08d}",
            donor_key=f"{first + i:016x}",
            router_id="fleet-router",
            worker_id=(first + i) % WORKERS,
            dp_rank=0,
            deployment=deployment,
            namespace=NAMESPACES[(first + i) % len(NAMESPACES)],
            num_tokens=BLOCKS * BLOCK_SIZE,
            block_size=BLOCK_SIZE,
            block_hashes=hashes[i].tolist(),
            embedding=embeddings[i].tobytes(),
            embedding_dim=DIM,
            registered_at=1000.0 + first + i,
        )
        for i in range(count)
    ]
    return out, hashes


def catalog_state(catalog: Any) -> dict[str, Any]:
    """Donor and resident counts and a digest of the whole catalog (``snapshot``: ids, workers, namespaces, blocks,
    residency, in canonical order)."""
    import xxhash

    snapshot = catalog.snapshot()
    return {
        "donors": len(snapshot),
        "resident": sum(1 for d in snapshot if d["resident"]),
        "digest": xxhash.xxh3_64_hexdigest(json.dumps(snapshot, sort_keys=True).encode()),
    }


def resident_count(catalog: Any) -> int:
    """Resident donors over the namespaces (polled while B syncs: a counter, or the live sets of older trees)."""
    if hasattr(catalog, "resident_count"):
        return sum(catalog.resident_count(ns) for ns in NAMESPACES)
    return sum(len(catalog._residency.resident(ns)) for ns in NAMESPACES)


def router_config(
    nats_url: str,
    index: str,
    capacity: int,
    sync_window: int | None = None,
    snapshots: str | None = None,
    heap_top_mib: int | None = None,
) -> Any:
    from semblend_dynamo.config import SemblendConfig
    from tests.adversarial.router_harness import router_config as harness_config

    settings: dict[str, Any] = {"max_message_bytes": 1 << 20, "index_capacity": capacity, "block_size": BLOCK_SIZE}
    if sync_window is not None:
        settings["sync_window"] = sync_window
    if snapshots is not None and "sync_index_snapshots" in SemblendConfig.model_fields:  # trees before it have none
        settings["sync_index_snapshots"] = snapshots == "on"
    if heap_top_mib is not None:
        settings["heap_top_mib"] = heap_top_mib
    if index == "none":
        settings["enabled"] = False
    else:
        settings["index_backend"] = index
    return harness_config(nats_url, **settings)


def bound_heap(cfg: Any) -> None:
    """The heap's thresholds as the router's ``serve()`` sets them (trees before ``router/heap.py`` have none)."""
    try:
        from semblend_dynamo.router.heap import bound_heap_tops
    except ImportError:
        return
    bound_heap_tops(cfg.heap_top_mib << 20)


# --- replica processes -------------------------------------------------------------------------------------------
async def peer(args: argparse.Namespace) -> None:
    from tests.adversarial.router_harness import InProcessRouter

    cfg = router_config(
        args.nats, args.index if args.peer_index else "none", args.n + 1000, heap_top_mib=args.heap_top_mib
    )
    bound_heap(cfg)
    replica = InProcessRouter(cfg)
    catalog = replica.router.catalog
    add_many = getattr(catalog, "add_many", None)  # the v1 tree has only add()
    started = time.perf_counter()
    for first in range(0, args.n, CHUNK):
        regs, hashes = registrations(first, min(CHUNK, args.n - first), replica.deployment)
        if add_many is not None:
            add_many(regs)
        else:
            for registration in regs:
                catalog.add(registration)
        catalog.apply_kv_events(block_events(first, len(regs), hashes))
    fill_s = time.perf_counter() - started
    drain = getattr(catalog, "drain", None)  # its own index built (with --peer-index)
    drained = drain is None or await asyncio.to_thread(drain, args.timeout)
    index_s = time.perf_counter() - started
    state = catalog_state(catalog)
    await replica.start()
    fill_rss = rss_mb()[0]
    await settled(replica.router, started + args.timeout)  # as a serving replica does after its kv-events
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print(
        "PEER_READY "
        + json.dumps(
            state
            | {
                "fill_s": fill_s,
                "index_s": index_s if drained else None,
                "fill_rss_mb": fill_rss,
                "rss_mb": rss_mb()[0],
            }
        ),
        flush=True,
    )
    await stop.wait()
    await replica.close()


async def late(args: argparse.Namespace) -> None:
    from tests.adversarial.router_harness import InProcessRouter

    want = json.loads(args.expect)
    if args.indexer_batch:
        from semblend_dynamo.router import indexer

        indexer.BATCH = args.indexer_batch
    cfg = router_config(args.nats, args.index, args.n + 1000, args.sync_window, args.snapshots, args.heap_top_mib)
    bound_heap(cfg)
    replica = InProcessRouter(cfg)
    catalog = replica.router.catalog
    started = time.perf_counter()
    for first in range(0, args.n, CHUNK):
        _, hashes = chunk_hashes(first, min(CHUNK, args.n - first))
        catalog.merge_dump(block_events(first, len(hashes), hashes))
    blocks_s = time.perf_counter() - started
    base_rss = rss_mb()[0]
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
    connect, cpu, times = time.perf_counter(), time.process_time(), os.times()
    await replica.start()  # connects; the router asks its peers for their donors on connect
    deadline = connect + args.timeout
    while not (len(catalog) == want["donors"] and resident_count(catalog) == want["resident"]):
        if time.perf_counter() > deadline:
            sent = replica.metrics.events_out.labels("sync")._value.get()
            held = {"donors": len(catalog), "pages": replica.subscriber.received["sync_pages"], "requests": sent}
            print("LATE_TIMEOUT " + json.dumps(held), flush=True)
            return
        await asyncio.sleep(0.02)
    converged_s, cpu_s = time.perf_counter() - connect, time.process_time() - cpu
    user_s, sys_s = (after - before for after, before in zip(os.times()[:2], times[:2], strict=True))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    rss, peak = rss_mb()
    indexed = await index_caught_up(catalog, deadline - time.perf_counter())
    if indexed:
        indexed["indexed_s"] -= connect
        indexed["indexed_rss_mb"], indexed["indexed_peak_mb"] = rss_mb()
    settled_at = await settled(replica.router, deadline)
    settle = {"settled_s": settled_at - connect, "settled_rss_mb": rss_mb()[0]} if settled_at else {}
    state = catalog_state(catalog)
    metrics = replica.metrics
    snapshots = getattr(metrics, "index_snapshots", None)
    if snapshots is not None:
        settle["snapshot"] = (
            ",".join(
                f"{s.labels['outcome']}"
                for m in snapshots.collect()
                for s in m.samples
                if s.name.endswith("_total") and s.labels["side"] == "fetched" and s.value
            )
            or "-"
        )
        counters = getattr(catalog.indexer, "counters", {})
        settle["snapshot_confirmed"] = counters.get("snapshot_confirmed", 0)
        settle["snapshot_pruned"] = counters.get("snapshot_pruned", 0)
    result = (
        indexed
        | settle
        | {
            "blocks_s": blocks_s,
            "converged_s": converged_s,
            "cpu_s": cpu_s,
            "user_s": user_s,
            "sys_s": sys_s,
            "equal": state == {k: want[k] for k in state},
            "pages": replica.subscriber.received["sync_pages"],
            "requests": metrics.events_out.labels("sync")._value.get(),
            "rejected": sum(n for (stream, _), n in replica.subscriber.rejected.items() if stream == "sync_pages"),
            "rss_mb": rss,
            "peak_mb": peak,
            "rss_before_sync_mb": base_rss,
        }
    )
    print("LATE_DONE " + json.dumps(result), flush=True)
    await replica.close()


async def settled(router: Any, deadline: float) -> float | None:
    """Once the router's loop has finished the block maps' rewrites left in progress and handed the freed heap back
    (``SemanticRouter.settling``; trees before it have none): when (``perf_counter``), or None."""
    settle = getattr(router, "_settle_soon", None)
    if settle is None:
        return None
    settle()
    while router.settling:
        if time.perf_counter() > deadline:
            return None
        await asyncio.sleep(0.02)
    return time.perf_counter()


async def index_caught_up(catalog: Any, timeout: float) -> dict[str, Any]:
    """With a search index: wait (up to ``timeout`` s) for the catalog's indexer to apply what the sync queued; then
    when (``perf_counter``), how many resident donors the index holds, and the adds the indexer dropped."""
    indexer = getattr(catalog, "indexer", None)
    if indexer is None:
        return {}
    drained = await asyncio.to_thread(indexer.drain, max(0.0, timeout))
    at = time.perf_counter()
    index = indexer.discovery.index
    resident = set().union(*(catalog.resident(ns) for ns in NAMESPACES))
    return {
        "indexed_s": at,
        "index_drained": drained,
        "in_index": sum(1 for donor_id in resident if donor_id in index),
        "index_dropped": sum(n for key, n in indexer.counters.items() if key.startswith("dropped")),
    }


def breakdown(n: int) -> None:
    """Where a sync's CPU goes per donor, in one process (no NATS): the peer building pages from its catalog, the late
    replica decoding them, taking their rows, holding them and adding them as the handler does; the add with Python's
    cyclic GC on, off during each add and frozen after it (as the handler does while pages are awaited), and off (the
    same pages)."""
    import gc

    from semblend_dynamo.events.codec import decode, encode
    from semblend_dynamo.events.schemas import SYNC_PAGE_OVERHEAD, DonorSyncPage, DonorSyncRequest
    from semblend_dynamo.router.catalog import DonorCatalog
    from semblend_dynamo.router.gc_freeze import SyncGcFreeze
    from semblend_dynamo.router.sync import HeldPages, build_page

    peer_catalog = DonorCatalog(n + 1000, None, index_dtype="i8")  # as a replica whose index is i8 (the default)
    for first in range(0, n, CHUNK):
        regs, hashes = registrations(first, min(CHUNK, n - first), "d" * 16)
        peer_catalog.add_many(regs)
        peer_catalog.apply_kv_events(block_events(first, len(regs), hashes))
    request = DonorSyncRequest(router_id="late", deployment="d" * 16)
    pages: list[bytes] = []
    after: int | None = 0
    started = time.process_time()
    while after is not None:
        page = peer_catalog.page(after, 4096, max_bytes=(1 << 20) - SYNC_PAGE_OVERHEAD)
        data, _ = build_page(
            page.cursors,
            page.columns,
            page.more,
            request,
            router_id="peer",
            deployment="d" * 16,
            last_cursor=peer_catalog.last_cursor,
            max_bytes=1 << 20,
            encode=encode,
        )
        pages.append(data)
        after = page.cursors[-1] if page.more else None
    serve_s = time.process_time() - started
    del peer_catalog
    gc.collect()
    for gc_mode in ("on", "frozen", "off"):
        freeze = SyncGcFreeze()
        held = HeldPages()
        late_catalog = DonorCatalog(n + 1000, None, index_dtype="i8")
        for first in range(0, n, CHUNK):
            count = min(CHUNK, n - first)
            late_catalog.merge_dump(block_events(first, count, chunk_hashes(first, count)[1]))
        gc.collect()
        if gc_mode == "off":
            gc.disable()
        decode_s = build_s = add_s = 0.0
        for data in pages:
            t0 = time.process_time()
            page = decode(data, DonorSyncPage, max_bytes=1 << 20, deployment="d" * 16)
            t1 = time.process_time()
            rows = page.rows()
            t2 = time.process_time()
            if held.put(rows) or data is pages[-1]:  # as the handler holds pages and adds them together
                held.seal()
                while (chunk := held.next_chunk()) is not None:
                    with freeze.adding(gc_mode == "frozen" and data is not pages[-1]):  # as the handler
                        late_catalog.add_rows(chunk)
                if gc_mode == "frozen":
                    freeze.page_added(data is not pages[-1])
            t3 = time.process_time()
            decode_s, build_s, add_s = decode_s + t1 - t0, build_s + t2 - t1, add_s + t3 - t2
        gc.enable()
        assert len(late_catalog) == n and resident_count(late_catalog) == n
        row = {"serve": serve_s, "decode": decode_s, "rows": build_s, "add_rows": add_s}
        print(
            f"{n:,} donors, {len(pages)} pages, GC {gc_mode}: CPU us per donor "
            + ", ".join(f"{k} {v / n * 1e6:.1f}" for k, v in row.items())
            + f"; late replica total {(decode_s + build_s + add_s):.1f} s",
            flush=True,
        )
        del late_catalog
        gc.collect()


# --- the orchestrator --------------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_line(proc: subprocess.Popen[str], prefixes: tuple[str, ...], timeout: float) -> tuple[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process exited with {proc.wait()} before {prefixes}")
        for prefix in prefixes:
            if line.startswith(prefix + " "):
                return prefix, json.loads(line[len(prefix) + 1 :])
    raise TimeoutError(f"no {prefixes} within {timeout}s")


def measure(
    tree: Path,
    n: int,
    index: str,
    timeout: float,
    sync_window: int | None = None,
    profile: str | None = None,
    indexer_batch: int | None = None,
    peer_index: bool = False,
    snapshots: Sequence[str | None] = (None,),
    heap_top_mib: int | None = None,
) -> list[dict[str, Any]]:
    """One peer (A) and, one after the other, a late replica (B) per ``snapshots`` mode; a row per B."""
    from tests.support.nats import NatsServer
    from tests.support.processes import stop_process

    base = [sys.executable, __file__, "--tree", str(tree), "--n", str(n), "--index", index]
    base += ["--heap-top-mib", str(heap_top_mib)] if heap_top_mib is not None else []
    rows = []
    with NatsServer() as nats:
        peer_cmd = [*base, "--role", "peer", "--nats", nats.url, "--timeout", str(timeout)]
        peer_proc = subprocess.Popen(
            peer_cmd + (["--peer-index"] if peer_index else []), stdout=subprocess.PIPE, text=True
        )
        try:
            _, ready = read_line(peer_proc, ("PEER_READY",), timeout)
            for mode in snapshots:
                peer_cpu = cpu_seconds(peer_proc.pid)
                late_cmd = [*base, "--role", "late", "--nats", nats.url, "--expect", json.dumps(ready)]
                late_cmd += ["--sync-window", str(sync_window)] if sync_window is not None else []
                late_cmd += ["--profile", profile] if profile else []
                late_cmd += ["--indexer-batch", str(indexer_batch)] if indexer_batch else []
                late_cmd += ["--snapshots", mode] if mode else []
                late_proc = subprocess.Popen([*late_cmd, "--timeout", str(timeout)], stdout=subprocess.PIPE, text=True)
                try:
                    kind, done = read_line(late_proc, ("LATE_DONE", "LATE_TIMEOUT"), timeout + 600)
                finally:
                    stop_process(late_proc, timeout=30)
                time.sleep(PEER_QUIET_S)  # A hands the heap its replies freed back once the requests stop
                peer_rss, peer_cpu = rss_mb(peer_proc.pid)[0], cpu_seconds(peer_proc.pid) - peer_cpu
                if kind == "LATE_TIMEOUT":  # a row: the v1 sync stalls for good once a request is rate-limited
                    done = {
                        "converged_s": None,
                        "held": done["donors"],
                        "pages": done["pages"],
                        "requests": done["requests"],
                    }
                elif not done["equal"]:
                    raise AssertionError(f"late replica's catalog differs from its peer's at {n} donors")
                rows.append(
                    done
                    | {
                        "donors": n,
                        "index": index + ("" if mode is None else f" (snapshots {mode})"),
                        "peer_fill_s": ready["fill_s"],
                        "peer_index_s": ready.get("index_s") if peer_index else None,
                        "peer_fill_rss_mb": ready.get("fill_rss_mb"),
                        "peer_ready_rss_mb": ready.get("rss_mb"),
                        "peer_rss_mb": peer_rss,
                        "peer_cpu_s": peer_cpu,
                    }
                )
        finally:
            stop_process(peer_proc, timeout=30)
    return rows


def _mb(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def baseline_tree(ref: str, into: str) -> Path:
    export_ref(ref, into)  # with its compiled span aligner, as this tree runs
    return Path(into)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--donors", type=int, nargs="+", default=[10_000, 100_000, 300_000, 1_000_000])
    p.add_argument("--baseline-donors", type=int, nargs="*", default=[10_000])
    p.add_argument("--baseline-ref", default=BASELINE_REF)
    p.add_argument("--index", choices=("none", "numpy", "usearch"), default="none", help="replica B's search index")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument(
        "--sync-window", type=int, help="replica B's sync requests in flight per peer (default: the config's)"
    )
    p.add_argument("--baseline-timeout", type=float, default=120.0)
    p.add_argument(
        "--profile", metavar="FILE", help="cProfile replica B (CPU time) from connect to converged into FILE"
    )
    p.add_argument(
        "--indexer-batch", type=int, help="replica B's indexer: changes taken per turn (default: the module's BATCH)"
    )
    p.add_argument(
        "--peer-index", action="store_true", help="replica A builds the same search index of its donors before B starts"
    )
    p.add_argument(
        "--snapshots",
        nargs="+",
        choices=("on", "off"),
        help="replica B loads A's search index whole (on) or not (off); one B of each given against the same A",
    )
    p.add_argument(
        "--heap-top-mib", type=int, help="both replicas' heap bound (default: the config's; 0: glibc's own thresholds)"
    )
    p.add_argument("--breakdown", type=int, metavar="N", help="only: where the CPU goes per donor, in one process")
    p.add_argument("--role", choices=("peer", "late"), help=argparse.SUPPRESS)
    p.add_argument("--tree", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--nats", help=argparse.SUPPRESS)
    p.add_argument("--expect", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.path.insert(0, args.tree or str(ROOT))
    if args.role == "peer":
        asyncio.run(peer(args))
        return
    if args.role == "late":
        args.snapshots = args.snapshots[0] if args.snapshots else None
        asyncio.run(late(args))
        return
    if args.breakdown:
        breakdown(args.breakdown)
        return
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()}")
    rows = []
    timeouts = {"v1 " + args.baseline_ref: args.baseline_timeout, "v2 (this tree)": args.timeout}
    with tempfile.TemporaryDirectory(prefix="semblend-v1-") as tmp:
        old = baseline_tree(args.baseline_ref, tmp) if args.baseline_donors else ROOT
        for n in args.baseline_donors:
            for row in measure(old, n, args.index, args.baseline_timeout):
                rows.append(("v1 " + args.baseline_ref, row))
                print(json.dumps(row), flush=True)
    for n in args.donors:
        late_modes = args.snapshots if args.role is None and args.snapshots else [None]
        for row in measure(
            ROOT,
            n,
            args.index,
            args.timeout,
            args.sync_window,
            args.profile,
            args.indexer_batch,
            args.peer_index,
            late_modes,
            args.heap_top_mib,
        ):
            rows.append(("v2 (this tree)", row))
            print(json.dumps(row), flush=True)
    print(
        "\n| sync | donors | B index | B blocks recovered s | B converged s | donors/s | B CPU s | A CPU s | pages "
        "| B RSS MB (peak) | B RSS MB settled | A RSS MB filled / settled / after serving |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    indexed = [(name, r) for name, r in rows if "indexed_s" in r]
    for name, r in rows:
        if r["converged_s"] is None:
            print(
                f"| {name} | {r['donors']:,} | {r['index']} | | not converged: {r['held']:,} donors after "
                f"{timeouts[name]:.0f} s ({r['pages']} pages for {r['requests']:.0f} requests) |"
            )
            continue
        print(
            f"| {name} | {r['donors']:,} | {r['index']} | {r['blocks_s']:.1f} | **{r['converged_s']:.1f}** "
            f"| {r['donors'] / r['converged_s']:,.0f} | {r['cpu_s']:.1f} | {r['peer_cpu_s']:.1f} | {r['pages']} "
            f"| {r['rss_mb']:.0f} ({r['peak_mb']:.0f}) | {_mb(r.get('settled_rss_mb'))} "
            f"| {_mb(r.get('peer_fill_rss_mb'))} / {_mb(r.get('peer_ready_rss_mb'))} / {r['peer_rss_mb']:.0f} |"
        )
    if indexed:  # B's search index after the catalog converged
        print(
            "\n| sync | donors | B index | A index built s | B converged s | B index caught up s | resident donors in "
            "the index | adds dropped | snapshot (confirmed / pruned) | B RSS MB after indexing (peak) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, r in indexed:
            peer_index = r.get("peer_index_s")
            print(
                f"| {name} | {r['donors']:,} | {r['index']} | {'-' if peer_index is None else f'{peer_index:.1f}'} "
                f"| {r['converged_s']:.1f} | {r['indexed_s']:.1f}{'' if r['index_drained'] else ' (timed out)'} "
                f"| {r['in_index']:,} | {r['index_dropped']:,} | {r.get('snapshot', '-')} "
                f"({r.get('snapshot_confirmed', 0):,} / {r.get('snapshot_pruned', 0):,}) "
                f"| {r['indexed_rss_mb']:.0f} ({r['indexed_peak_mb']:.0f}) |"
            )


if __name__ == "__main__":
    main()
