"""Warm-loop costs of the pieces sched3 changed, in the tree it runs in (median µs of 50,000 calls, 8K tokens).

``python benchmarks/results/sched3/micro.py`` from a tree's root (its packages on the path): the planner on one exact
span; a ``ValidatedLoad`` built and its two flags read four times; an audit record written to memory the two ways the
connector can (keywords to ``AuditWriter.write``, or an ``AuditRecord`` built directly); a donor's tokens unboxed the
two ways (``np.fromiter``, ``array.fromlist`` + int64 copy; 3,000 calls, a fresh copy of the list each time).
"""

from __future__ import annotations

import array
import random
import time
from collections.abc import Callable

import numpy as np

from semblend_dynamo.audit import AuditEvent, AuditRecord, AuditWriter
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.planner import Planner
from semblend_dynamo.span_aligner import Span
from trtllm_connector.validation import Segment, ValidatedLoad


def median_us(fn: Callable[[], object], reps: int = 50_000) -> float:
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        xs.append(time.perf_counter_ns() - t0)
    xs.sort()
    return xs[len(xs) // 2] / 1e3


def main() -> None:
    planner = Planner(SemblendConfig(block_size=32, exact_materialization_only=True))
    spans = [Span("0:4", 0, 0, 6144)]
    print(f"planner, one exact span: {median_us(lambda: planner.plan(8192, spans, approximate_donors=set())):.2f}")
    segment = Segment(None, 1, 0, 0, 6144, True)  # type: ignore[arg-type]

    def load() -> object:
        v = ValidatedLoad(0, 6144, (segment,))
        return v.requires_rope_correction, v.lineage, v.lineage, v.lineage

    print(f"ValidatedLoad + four flag reads: {median_us(load):.2f}")
    writer = AuditWriter(None)
    tags = {"role": "recipient", "trace_id": "0123456789abcdef"}
    fields = dict(request_id="1", similarity=None, worker_id="0", namespace="ab" * 16, found=True, donor_id="0:1")

    def keywords() -> object:
        return writer.write(flush=False, event=AuditEvent.LOOKUP, **tags, **fields, mode="exact")

    def record() -> object:
        rec = AuditRecord(event=AuditEvent.LOOKUP, role=tags["role"], trace_id=tags["trace_id"], **fields, mode="exact")
        return writer.write(rec, flush=False)

    print(f"audit record, keywords to write: {median_us(keywords):.2f}; built directly: {median_us(record):.2f}")
    rng = random.Random(0)
    tokens = [rng.randrange(1, 32000) for _ in range(8192)]

    def fromiter() -> object:
        return np.fromiter(list(tokens), dtype=np.int64, count=len(tokens))

    def fromlist() -> object:
        buf = array.array("I")
        buf.fromlist(list(tokens))
        return np.frombuffer(buf, dtype=np.uint32).astype(np.int64)

    copy = median_us(lambda: list(tokens), 3000)
    print(
        f"8K tokens to int64 (list copy {copy:.1f} included): np.fromiter {median_us(fromiter, 3000):.1f}, "
        f"fromlist + astype {median_us(fromlist, 3000):.1f}"
    )


if __name__ == "__main__":
    main()
