"""Span alignment latency: an 8K-token target against 10K resident donors, next to a naive baseline.

Donors: 10,000 token sequences of 256..2048 tokens (about 11M tokens), one namespace; a fifth of them start with
the same 256-token system prompt (shared boilerplate is the costly case for a chunk index). Targets: 8,192 tokens
made of that system prompt, six 512-token passages copied from random donors at random (unaligned) offsets, and
fresh tokens ("hit"); or fresh tokens only ("miss", the common case).

Baseline, same run: the naive per-token scan — a Python dict of donor chunk tuples probed at every target offset,
then token-by-token extension in Python. The aligner's two paths, numpy and the compiled core (when loaded: see
``python -m semblend_dynamo._native status``), are timed call by call in turns on the same index and targets, and
must return the same spans. Usage: ``.venv/bin/python benchmarks/bench_span_alignment.py``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from semblend_dynamo import _native
from semblend_dynamo.span_aligner import SpanAligner

BS = 32
MIN_SPAN = 64
NS = "bench"


def build(n_donors: int, seed: int) -> tuple[list[np.ndarray], np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 100_000, 256)
    donors = []
    for i in range(n_donors):
        body = rng.integers(0, 100_000, int(rng.integers(256, 2049)))
        donors.append(np.concatenate([system, body]) if i % 5 == 0 else body)
    return donors, system, rng


def hit_target(donors: list[np.ndarray], system: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    parts = [system]
    for _ in range(6):
        d = donors[int(rng.integers(len(donors)))]
        if d.size < 600:
            continue
        start = int(rng.integers(0, d.size - 512))
        parts.append(d[start : start + 512])
        parts.append(rng.integers(100_000, 200_000, int(rng.integers(20, 200))))
    target = np.concatenate(parts)[:n]
    return np.concatenate([target, rng.integers(100_000, 200_000, n - target.size)]).astype(np.int64)


class NaiveAligner:
    """Baseline: per-token dict probe of donor chunk tuples, Python extension along each diagonal."""

    def __init__(self, donors: list[np.ndarray]) -> None:
        self.donors = [d.tolist() for d in donors]
        self.chunks: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for i, d in enumerate(self.donors):
            for off in range(0, len(d) - BS + 1, BS):
                self.chunks.setdefault(tuple(d[off : off + BS]), []).append((i, off))

    def align(self, target: list[int]) -> list[tuple[int, int, int, int]]:
        spans = []
        seen: set[tuple[int, int]] = set()
        for pos in range(len(target) - BS + 1):
            for donor, off in self.chunks.get(tuple(target[pos : pos + BS]), [])[-16:]:
                delta = pos - off
                if (donor, delta) in seen:
                    continue
                seen.add((donor, delta))
                d = self.donors[donor]
                s, e = pos, pos + BS
                while s > 0 and s - delta > 0 and target[s - 1] == d[s - 1 - delta]:
                    s -= 1
                while e < len(target) and e - delta < len(d) and target[e] == d[e - delta]:
                    e += 1
                s, e = -(-s // BS) * BS, e // BS * BS
                if e - s >= MIN_SPAN:
                    spans.append((donor, s - delta, s, e - s))
        return spans


def percentiles(samples: list[float]) -> tuple[float, float]:
    arr = np.array(samples)
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--donors", type=int, default=10_000)
    parser.add_argument("--target-tokens", type=int, default=8192)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--baseline-iterations", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    donors, system, rng = build(args.donors, args.seed)
    aligner = SpanAligner(BS, MIN_SPAN)
    t0 = time.perf_counter()
    for i, d in enumerate(donors):
        aligner.add_donor(f"d{i}", NS, d)
    add_s = time.perf_counter() - t0
    hits = [hit_target(donors, system, rng, args.target_tokens) for _ in range(16)]
    misses = [rng.integers(100_000, 200_000, args.target_tokens).astype(np.int64) for _ in range(16)]

    paths = ["numpy", "native"] if aligner.native else ["numpy"]

    def measure(targets: list[np.ndarray], as_list: bool) -> dict[str, tuple[list[float], list[float], int]]:
        """Per path: wall-clock and this thread's CPU time (immune to preemption by other processes) per call, and
        the tokens covered per call. The paths take turns, call by call, in alternating order."""
        inputs = [t.tolist() if as_list else t for t in targets]
        for path in paths:
            aligner.native = path == "native"
            for t in inputs[:4]:
                aligner.align(NS, t)  # warm-up
        out: dict[str, tuple[list[float], list[float], int]] = {path: ([], [], 0) for path in paths}
        for i in range(args.iterations):
            t = inputs[i % len(inputs)]
            found = []
            for path in paths if i % 2 else paths[::-1]:
                aligner.native = path == "native"
                c0 = time.thread_time()
                t0 = time.perf_counter()
                spans = aligner.align(NS, t)
                wall, cpu, covered = out[path]
                wall.append((time.perf_counter() - t0) * 1e6)
                cpu.append((time.thread_time() - c0) * 1e6)
                out[path] = (wall, cpu, covered + sum(s.length for s in spans))
                found.append(spans)
            assert all(spans == found[0] for spans in found), "the aligner's paths disagree"
        return {path: (wall, cpu, covered // args.iterations) for path, (wall, cpu, covered) in out.items()}

    hit = measure(hits, as_list=False)
    miss = measure(misses, as_list=False)
    listed = measure(hits, as_list=True)

    naive = NaiveAligner(donors)
    naive_us, naive_cpu = [], []
    for i in range(args.baseline_iterations):
        target = hits[i % len(hits)].tolist()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        naive.align(target)
        naive_us.append((time.perf_counter() - t0) * 1e6)
        naive_cpu.append((time.thread_time() - c0) * 1e6)

    print(f"host: {platform.machine()}, python {platform.python_version()}, numpy {np.__version__}")
    print(f"cpus: {os.cpu_count()}, load average (1/5/15 min) at the end: {os.getloadavg()}")
    print(
        f"donors: {len(donors)} ({sum(d.size for d in donors) / 1e6:.1f}M tokens, indexed in {add_s:.1f} s), "
        f"target {args.target_tokens} tokens, block {BS}, min span {MIN_SPAN}"
    )
    print(f"aligner paths: {', '.join(paths)} (compiled core: {_native.REASON})")
    rows = []
    for path in paths:
        rows += [
            (f"align, {path}, hit target (numpy input)", *hit[path][:2], f"avg {hit[path][2]} tokens covered"),
            (f"align, {path}, miss target (numpy input)", *miss[path][:2], ""),
            (f"align, {path}, hit target (list input)", *listed[path][:2], ""),
        ]
    rows.append(("baseline: naive per-token dict scan, hit", naive_us, naive_cpu, f"n={len(naive_us)}"))
    print(f"{'case':<46}{'wall p50 us':>12}{'wall p99 us':>12}{'cpu p50 us':>11}{'cpu p99 us':>11}")
    for name, wall, cpu, note in rows:
        w50, w99 = percentiles(wall)
        c50, c99 = percentiles(cpu)
        print(f"{name:<46}{w50:>12.0f}{w99:>12.0f}{c50:>11.0f}{c99:>11.0f}   {note}")
    for path in paths:
        hit50, hit99 = percentiles(hit[path][0])
        cpu99 = percentiles(hit[path][1])[1]
        print(
            f"{path}: speed-up vs baseline (wall p50): {percentiles(naive_us)[0] / hit50:.0f}x; goal p99 <= 500 us: "
            f"wall {'met' if hit99 <= 500 else 'NOT met'}, thread CPU {'met' if cpu99 <= 500 else 'NOT met'}"
        )
    if len(paths) == 2:
        for name, result in (("hit", hit), ("miss", miss), ("hit, list input", listed)):
            ratio = percentiles(result["numpy"][1])[0] / percentiles(result["native"][1])[0]
            print(f"native vs numpy, {name}: {ratio:.1f}x less thread CPU at p50")


if __name__ == "__main__":
    main()
