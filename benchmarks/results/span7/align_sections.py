"""Where ``SpanAligner.align`` spends its time (main's three-call native path), section by section.

Builds one aligner per token width (int64, the router's; uint32, the connector's) holding ``--donors`` random donors
of 512 tokens (the router benchmark's: vocabulary 100..7000, every 20th starting with a shared 256-token system
prompt when ``--shared``), then for 8K targets runs ``align``'s steps one by one with a timer around each, then
``align`` itself, and checks both give the same spans. Cases: ``hit`` (8 donors at shifted offsets among fresh tokens,
the router benchmark's span target), ``miss`` (tokens of the donors' vocabulary, no span). Prints µs p50 / p99.
Usage, against a tree with the three-call native path (main before span7; its internals are what is timed):
``PYTHONPATH=<that tree> python benchmarks/results/span7/align_sections.py [--donors 100000] [--requests 300]
[--shared]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from semblend_dynamo import _native
from semblend_dynamo.span_aligner import Span, SpanAligner, _Candidate

DONOR_TOKENS = 512
TARGET = 8192


def build(n: int, u32: bool, donors: np.ndarray) -> SpanAligner:
    al = SpanAligner(32, 64, tokens_u32=u32)
    for i in range(n):
        arr = donors[i].astype(np.uint32 if u32 else np.int64)
        arr.flags.writeable = False
        al.add_donor(f"d{i}", "ns", arr)
    return al


def target_hit(rng: np.random.Generator, donors: np.ndarray) -> np.ndarray:
    picks = rng.choice(len(donors), size=8, replace=False)
    filler = rng.integers(7000, 9000, size=TARGET - 8 * DONOR_TOKENS)
    return np.concatenate([filler[:2040], *[donors[i] for i in picks[::-1]], filler[2040:]])


def target_miss(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(100, 7000, size=TARGET)


def sections(al: SpanAligner, target: np.ndarray, times: dict[str, list[float]]) -> list[Span]:
    def lap(name: str, t: float) -> float:
        now = time.perf_counter()
        times.setdefault(name, []).append((now - t) * 1e6)
        return now

    t0 = t = time.perf_counter()
    table = al._tables["ns"]
    t_arr = np.ascontiguousarray(target, dtype=al.dtype)
    t = lap("ascontiguousarray (array given)", t)
    allowed = al._allowed_serials("ns", None)
    t = lap("_allowed_serials (None)", t)
    scan = _native.Scan(t_arr, al.anchor_tokens, al.block_size, al.min_span_tokens, al.max_diagonals, al._scan_buffer)
    al._scan_buffer = scan.buffer
    t = lap("Scan()", t)
    view = table.native_view()
    t = lap("native_view", t)
    positions, hashes = scan.hits(view, None)
    t = lap("scan.hits (sa_hits)", t)
    shared = al._shared_hits(table, positions, hashes, allowed) if positions else []
    t = lap("_shared_hits", t)
    diagonals = scan.diagonals(shared)
    t = lap("scan.diagonals (sa_diagonals)", t)
    rows: list[int] = []
    for serial, delta, _first, _last in diagonals:
        donor = al._by_serial[serial]
        rows += (donor.address, donor.tokens.size, delta, _first, _last)
    t = lap("rows loop", t)
    runs = scan.runs(rows) if diagonals else []
    t = lap("scan.runs (sa_runs)", t)
    found = [_Candidate(diagonals[r][0], s, e, diagonals[r][1]) for r, s, e in runs]
    t = lap("_Candidate list", t)
    chosen = al._choose(found, 16)
    t = lap("_choose", t)
    spans = [Span(al._by_serial[c.serial].donor_id, c.start - c.delta, c.start, c.end - c.start) for c in chosen]
    t = lap("Span objects", t)
    times.setdefault("sections (sum)", []).append((t - t0) * 1e6)
    times.setdefault("#shared hits", []).append(len(positions))
    times.setdefault("#diagonals", []).append(len(diagonals))
    times.setdefault("#runs", []).append(len(runs))
    return spans


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--donors", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--shared", action="store_true", help="every 20th donor starts with one system prompt")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    donors = rng.integers(100, 7000, size=(args.donors, DONOR_TOKENS), dtype=np.int64)
    if args.shared:
        donors[::20, :256] = donors[0, :256]
    for u32 in (False, True):
        t0 = time.perf_counter()
        al = build(args.donors, u32, donors)
        print(f"\n## {args.donors:,} donors, {'uint32' if u32 else 'int64'}, built in {time.perf_counter() - t0:.1f} s")
        for case in ("hit", "miss"):
            times: dict[str, list[float]] = {}
            whole: list[float] = []
            for i in range(args.requests + 20):
                target = target_hit(rng, donors) if case == "hit" else target_miss(rng)
                if args.shared and case == "hit":
                    target[:256] = donors[0, :256]
                target = target.astype(al.dtype)
                if i == 20:
                    times.clear()
                    whole.clear()
                spans = sections(al, target, times)
                t = time.perf_counter()
                ref = al.align("ns", target, max_spans=16)
                whole.append((time.perf_counter() - t) * 1e6)
                assert spans == ref, "sections differ from align"
            times["align (whole, right after)"] = whole
            print(f"\n### {case}: {len(ref)} spans\n| section | µs p50 | p99 |\n|---|---|---|")
            for name, values in times.items():
                print(f"| {name} | {np.percentile(values, 50):.1f} | {np.percentile(values, 99):.1f} |")


if __name__ == "__main__":
    main()
