"""Where this tree's one-call ``SpanAligner.align`` goes: the compiled call against the Python around it.

``python benchmarks/results/span7/align_parts.py [--donors 100000] [--calls 400]``: one aligner per width with the
align_ab.py donors and targets; per call, the parts of ``align`` (array check, views, the one C call, reading its rows,
``Span`` objects) each timed, then ``align`` itself right after (warm). µs p50 / p99.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from align_ab import DONOR_TOKENS, SYSTEM, targets  # type: ignore[import-not-found]

from semblend_dynamo import _native
from semblend_dynamo.span_aligner import SpanAligner


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--donors", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    print(f"# {_native.REASON}")
    rng = np.random.default_rng(7)
    donors = rng.integers(100, 7000, size=(args.donors, DONOR_TOKENS), dtype=np.int64)
    donors[::20, :SYSTEM] = donors[0, :SYSTEM]
    for width in (np.int64, np.uint32):
        al = SpanAligner(32, 64, tokens_u32=width is np.uint32)
        for i, row in enumerate(donors):
            arr = row.astype(width)
            arr.flags.writeable = False
            al.add_donor(f"d{i}", "ns", arr)
        al.align("ns", targets(rng, donors, "miss").astype(width), max_spans=16)  # sizes the work buffer
        for case in ("shifted hit", "shared hit", "miss"):
            times: dict[str, list[float]] = {}
            for i in range(args.calls + 20):
                target = targets(rng, donors, case).astype(width)
                marks = [time.perf_counter()]
                t = np.ascontiguousarray(target, dtype=al.dtype)
                table = al._tables["ns"]
                al._allowed_serials("ns", None)
                marks.append(time.perf_counter())
                tv, dv = table.native_view(), al._book.native_view()  # type: ignore[union-attr]
                marks.append(time.perf_counter())

                found = _native.LIBRARY.sa_align(  # type: ignore[union-attr]
                    tv.address,
                    dv.address,
                    t.__array_interface__["data"][0],
                    t.itemsize,
                    t.size,
                    *al._params,
                    16,
                    None,
                    -1,
                    al._work.__array_interface__["data"][0],
                )
                marks.append(time.perf_counter())
                rows = al._work[: 4 * found].reshape(-1, 4).tolist()
                marks.append(time.perf_counter())
                spans = al._spans_of(rows)
                marks.append(time.perf_counter())
                t0 = time.perf_counter()
                ref = al.align("ns", target, max_spans=16)
                whole = (time.perf_counter() - t0) * 1e6
                assert ref == spans
                if i < 20:
                    continue
                for name, a, b in zip(
                    (
                        "conversion, table, allowed",
                        "native views",
                        "sa_align (the C call)",
                        "rows .tolist()",
                        "Span objects",
                    ),
                    marks,
                    marks[1:],
                    strict=False,
                ):
                    times.setdefault(name, []).append((b - a) * 1e6)
                times.setdefault("parts (sum)", []).append((marks[-1] - marks[0]) * 1e6)
                times.setdefault("align, right after (warm)", []).append(whole)
            print(f"\n## {args.donors:,} donors, {width.__name__}, {case}: {len(ref)} spans")
            print("| part | µs p50 | p99 |\n|---|---|---|")
            for name, values in times.items():
                print(f"| {name} | {np.percentile(values, 50):.1f} | {np.percentile(values, 99):.1f} |")
        del al


if __name__ == "__main__":
    main()
