"""The router's added latency through Dynamo's stock Frontend, 100K resident donors, against an exact-only router.

One local graph, all real processes on 127.0.0.1: a nats-server, ``--workers`` stock ``dynamo.mocker --engine-type
trtllm`` workers, and two routed paths to them, each a stock ``dynamo.frontend`` in front of a SemBlend router
component:

* *semantic*: :mod:`.seeded_router` (the router with ``SEMBLEND_ENABLED=1`` and ``--donors`` resident donors of
  512 tokens spread over the workers, hash embedder);
* *exact-only* (the baseline): ``python -m semblend_dynamo.router`` with ``SEMBLEND_ENABLED=0``.

Both forward through Dynamo's ``KvRouter`` to the same mockers. The same requests go to both Frontends as streamed
``/v1/completions`` with token-id prompts of 8,192 tokens and ``max_tokens`` 1; latency is the request's time to its
first streamed chunk at the client. Cases:

* sequential, span path: each prompt holds 8 donors in another order behind 2,048 filler tokens (no exact prefix,
  8 token-exact spans: the semantic router places it on a donor's worker); the two paths alternate which goes first;
* 200 concurrent: on the semantic path 100 span-path prompts plus 100 sharing nothing with any donor (they need an
  embedding), against 200 span-path prompts on the exact-only path; the router's embedding counters say how the
  100 fared, and none of the span-path requests touches the embedding queue.

"added" is semantic minus exact-only at the same percentile. The router's own decision counters (``/metrics``) are
read before and after to count placements.

Usage: ``.venv/bin/python -m benchmarks.frontend_path.run [--donors 100000] [--requests 300] [--workers 2]
[--spans-during-exact on|off] [--aligner-release-gil on|off]
[--gil-switch-interval-ms MS]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import aiohttp
import numpy as np

from semblend_apps.replay.http_target import scrape
from semblend_apps.up import LocalGraph, UpConfig, UpError, free_port

from .workload import BLOCK, donor_tokens, span_request, unrelated_request

ROOT = Path(__file__).resolve().parents[2]

MODEL = "bench"
CONCURRENT = 200
SEED_TIMEOUT_S = 1800.0


class BenchGraph(LocalGraph):
    """Mockers plus two Frontend -> router paths (namespaces ``sem`` and ``exact``) to the same workers."""

    def __init__(
        self,
        cfg: UpConfig,
        donors: int,
        spans_during_exact: bool = True,
        aligner_release_gil: bool = True,
        gil_switch_interval_ms: float | None = None,
    ) -> None:
        super().__init__(cfg)
        self.donors = donors
        self.spans_during_exact = spans_during_exact
        self.aligner_release_gil = aligner_release_gil
        self.gil_switch_interval_ms = gil_switch_interval_ms
        self.urls: dict[str, str] = {}
        self.metrics: dict[str, str] = {}

    def start(self) -> None:
        model_dir = self.start_workers()
        config = json.loads((model_dir / "config.json").read_text())
        config["max_position_embeddings"] = 32768  # 8K prompts plus the answer
        (model_dir / "config.json").write_text(json.dumps(config))
        for name, enabled in (("exact", False), ("sem", True)):
            port = free_port()
            env = self._router_env(model_dir, port)
            env.update(
                {
                    "SEMBLEND_ROUTER_NAMESPACE": name,
                    "SEMBLEND_ENABLED": "1" if enabled else "0",
                    "SEMBLEND_INDEX_CAPACITY": str(max(2 * self.donors, 100_000)),
                    "SEMBLEND_SPANS_DURING_EXACT": "1" if self.spans_during_exact else "0",
                    "SEMBLEND_ALIGNER_RELEASE_GIL": "1" if self.aligner_release_gil else "0",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                }
            )
            if self.gil_switch_interval_ms is not None:
                env["SEMBLEND_GIL_SWITCH_INTERVAL_MS"] = str(self.gil_switch_interval_ms)
            module = "benchmarks.frontend_path.seeded_router" if enabled else "semblend_dynamo.router"
            cmd = [sys.executable, "-m", module] + (["--donors", str(self.donors)] if enabled else [])
            self._spawn(f"router-{name}", cmd, env)
            router = self.children[-1]
            self._wait(
                lambda r=router: "SEMBLEND_ROUTER_READY" in r.log_tail(100_000), f"{name} router ready", SEED_TIMEOUT_S
            )
            self.metrics[name] = f"http://127.0.0.1:{port}"
            self.urls[name] = self.start_frontend(name, f"frontend-{name}")


async def first_chunk_ms(session: aiohttp.ClientSession, url: str, tokens: list[int], salt: str) -> float:
    """A streamed completion with a token-id prompt: ms to its first chunk (the stream is read to the end).

    ``salt`` is a ``|nonce`` cache salt (the default tenant): Dynamo hashes the prompt's blocks with it, so one
    path's request never finds the other path's copy of the same prompt in a worker's prefix cache.
    """
    body = {"model": MODEL, "prompt": tokens, "max_tokens": 1, "stream": True, "nvext": {"cache_salt": salt}}
    t0 = time.perf_counter()
    elapsed = None
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for _ in resp.content.iter_any():
            elapsed = elapsed if elapsed is not None else (time.perf_counter() - t0) * 1e3
    assert elapsed is not None
    return elapsed


def counter(samples: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return samples.get(key, 0.0)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def row(case: str, sem: list[float], exact: list[float]) -> str:
    s50, s99, e50, e99 = pct(sem, 50), pct(sem, 99), pct(exact, 50), pct(exact, 99)
    return f"| {case} | {s50:.3f} | {s99:.3f} | {e50:.3f} | {e99:.3f} | {s50 - e50:.3f} | {s99 - e99:.3f} |"


async def measure(graph: BenchGraph, args: argparse.Namespace) -> list[str]:
    donors = donor_tokens(args.donors)
    rng = np.random.default_rng(11)
    sem, exact = graph.urls["sem"], graph.urls["exact"]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for i in range(args.warmup):
            tokens = span_request(donors, rng)
            await first_chunk_ms(session, sem, tokens, f"|warm-sem-{i}")
            await first_chunk_ms(session, exact, tokens, f"|warm-exact-{i}")
        before = scrape(graph.metrics["sem"])
        seq: dict[str, list[float]] = {"sem": [], "exact": []}
        for i in range(args.requests):
            tokens = span_request(donors, rng)
            order = ("sem", "exact") if i % 2 == 0 else ("exact", "sem")
            for name in order:  # alternating, so neither path always finds the mocker's cache warm
                seq[name].append(await first_chunk_ms(session, graph.urls[name], tokens, f"|{name}-{i}"))
        after = scrape(graph.metrics["sem"])
        placed = counter(after, "semblend_router_decisions_total", outcome="semantic_placement") - counter(
            before, "semblend_router_decisions_total", outcome="semantic_placement"
        )
        burst_span = [span_request(donors, rng) for _ in range(CONCURRENT // 2)]
        burst_embed = [unrelated_request(rng) for _ in range(CONCURRENT // 2)]
        before = scrape(graph.metrics["sem"])
        conc_sem = await asyncio.gather(
            *(first_chunk_ms(session, sem, t, f"|burst-sem-{i}") for i, t in enumerate([*burst_embed, *burst_span]))
        )
        conc_exact = await asyncio.gather(
            *(first_chunk_ms(session, exact, t, f"|burst-exact-{i}") for i, t in enumerate([*burst_span, *burst_span]))
        )
        after = scrape(graph.metrics["sem"])
    embeddings = {
        r: counter(after, "semblend_router_prompt_embeddings_total", result=r)
        - counter(before, "semblend_router_prompt_embeddings_total", result=r)
        for r in ("ok", "budget", "queue_full")
    }
    emb, span = list(conc_sem[: CONCURRENT // 2]), list(conc_sem[CONCURRENT // 2 :])
    half = CONCURRENT // 2
    return [
        f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.1f}; {args.workers} mockers, 2 Frontends, 2 routers, nats-server",
        f"# donors {args.donors:,} resident (512 tokens), prompts 8,192 tokens, hash embedder",
        "",
        "| case | semantic p50 ms | semantic p99 ms | exact-only p50 ms | exact-only p99 ms | added p50 | added p99 |",
        "|---|---|---|---|---|---|---|",
        row(f"sequential, span path ({args.requests} requests, {placed:.0f} placed)", seq["sem"], seq["exact"]),
        row(f"{CONCURRENT} concurrent: the {half} span-path requests", span, list(conc_exact)),
        row(f"{CONCURRENT} concurrent: the {half} needing an embedding", emb, list(conc_exact)),
        "",
        f"embeddings for the {half} requests without spans: {embeddings}",
    ]


SLOW_MS = 5.0  # a request slower than this in a stage is counted: the tail the p99 hides
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FRONTEND = re.compile(r"^(\S+Z) .*metrics: request (received|completed) request_id=([0-9a-f-]+)")
_ROUTED = re.compile(r"routed request=\S+ .* stages_us=(\S*)")


def frontend_ms(log: Path) -> list[float]:
    """Each request's time inside a Frontend (its own log: received -> completed, microsecond stamps), in order."""
    started: dict[str, float] = {}
    out: list[tuple[float, float]] = []
    for line in log.read_text(errors="replace").splitlines():
        m = _FRONTEND.match(_ANSI.sub("", line))
        if m is None:
            continue
        stamp = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        if m.group(2) == "received":
            started[m.group(3)] = stamp
        elif m.group(3) in started:
            begun = started.pop(m.group(3))
            out.append((begun, (stamp - begun) * 1e3))
    return [ms for _, ms in sorted(out)]


def router_stages_ms(log: Path) -> list[dict[str, float]]:
    """Each routed request's stage times from the router's log line (``stages_us=``), in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _ROUTED.search(line)
        if m is not None:
            out.append({k: float(v) / 1e3 for k, v in (kv.split(":") for kv in m.group(1).split(",") if kv)})
    return out


def paired_added_ms(sem: list[dict[str, float]], exact: list[dict[str, float]]) -> tuple[float, float] | None:
    """p50 and p99 of each sequential request's own added time: the semantic router's ``total_added`` minus the
    exact-only router's for the same request (the i-th of each router's log); None without a pair."""
    added = [
        s["total_added"] - e["total_added"]
        for s, e in zip(sem, exact, strict=False)
        if "total_added" in s and "total_added" in e
    ]
    return (pct(added, 50), pct(added, 99)) if added else None


def breakdown(graph: BenchGraph, args: argparse.Namespace) -> list[str]:
    """The sequential requests seen from inside each Frontend and each router (their own logs)."""
    seq = slice(args.warmup, args.warmup + args.requests)
    lines = [
        "",
        "sequential requests from the processes' own logs (ms): p50 / p99",
        "",
        "| measure | semantic | exact-only | added p50 | added p99 |",
        "|---|---|---|---|---|",
    ]
    fe = {name: frontend_ms(graph.dir / f"frontend-{name}.log")[seq] for name in ("sem", "exact")}
    stages = {name: router_stages_ms(graph.dir / f"router-{name}.log")[seq] for name in ("sem", "exact")}

    def cells(sem: list[float], exact: list[float]) -> str:
        if not sem or not exact:
            return "- | - | - | -"
        s50, s99, e50, e99 = pct(sem, 50), pct(sem, 99), pct(exact, 50), pct(exact, 99)
        return f"{s50:.2f} / {s99:.2f} | {e50:.2f} / {e99:.2f} | {s50 - e50:.2f} | {s99 - e99:.2f}"

    lines.append(f"| inside the Frontend (received -> completed) | {cells(fe['sem'], fe['exact'])} |")
    for stage in (
        "total_added",
        "parse",
        "ask_loads",
        "exact",
        "spans",
        "semantic",
        "load",
        "decide",
        "hint",
        "forward_first_response",
    ):
        sem = [s[stage] for s in stages["sem"] if stage in s]
        exact = [s.get(stage, 0.0) for s in stages["exact"]]
        lines.append(f"| router stage `{stage}` | {cells(sem, exact)} |")
    paired = paired_added_ms(stages["sem"], stages["exact"])
    if paired is not None:
        lines.append(
            f"| router `total_added`, paired (each request's semantic minus its exact-only time) | - | - | "
            f"{paired[0]:.2f} | {paired[1]:.2f} |"
        )
    lines.append("")
    for name in ("sem", "exact"):
        for stage in ("decide", "total_added"):
            got = [s[stage] for s in stages[name] if stage in s]
            if got:
                slow = sum(ms > SLOW_MS for ms in got)
                lines.append(
                    f"{name} router `{stage}`: max {max(got):.2f} ms, {slow} of {len(got)} requests over {SLOW_MS:g} ms"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--speedup-ratio", type=float, default=10_000.0, help="mocker speed-up (default 10000)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--spans-during-exact",
        choices=("on", "off"),
        default="on",
        help="the semantic router's SEMBLEND_SPANS_DURING_EXACT (off: spans searched after the exact answer)",
    )
    parser.add_argument(
        "--aligner-release-gil",
        choices=("on", "off"),
        default="on",
        help="the routers' SEMBLEND_ALIGNER_RELEASE_GIL (off: the compiled span search keeps the GIL)",
    )
    parser.add_argument(
        "--gil-switch-interval-ms",
        type=float,
        default=None,
        help="the routers' SEMBLEND_GIL_SWITCH_INTERVAL_MS (default: the router's own default)",
    )
    args = parser.parse_args(argv)
    cfg = UpConfig(
        workers=args.workers,
        model_name=MODEL,
        block_size=BLOCK,
        gpu_blocks=65536,
        speedup_ratio=args.speedup_ratio,
        embedder="hash",
        workdir=args.workdir,
    )
    graph = BenchGraph(
        cfg,
        args.donors,
        spans_during_exact=args.spans_during_exact == "on",
        aligner_release_gil=args.aligner_release_gil == "on",
        gil_switch_interval_ms=args.gil_switch_interval_ms,
    )
    t0 = time.monotonic()
    try:
        graph.start()
        print(f"# graph up in {time.monotonic() - t0:.0f} s (logs {graph.dir})", flush=True)
        print("\n".join(asyncio.run(measure(graph, args))), flush=True)
        print("\n".join(breakdown(graph, args)), flush=True)
    except UpError as exc:
        print(f"bench_frontend_path: {exc}", file=sys.stderr)
        return 2
    finally:
        graph.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
