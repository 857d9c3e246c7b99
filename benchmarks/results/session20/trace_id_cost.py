"""A trace id's cost per call, drawn the session-19 way (128 at a time from os.urandom, one refill every 128th call)
and the way `semblend_dynamo.audit.new_trace_id` draws it now, alternating per call, with other memory touched between
calls (a 4 MB buffer walked) so that neither runs with its caches warm from the call before.

    python benchmarks/results/session20/trace_id_cost.py [CALLS]
"""

from __future__ import annotations

import os
import sys
import time

from semblend_dynamo.audit import new_trace_id

_pool: list[str] = []


def pooled_trace_id() -> str:
    """Session 19's `new_trace_id` (the baseline)."""
    try:
        return _pool.pop()
    except IndexError:
        raw = os.urandom(8 * 128).hex()
        _pool.extend([raw[i : i + 16] for i in range(16, len(raw), 16)])
        return raw[:16]


calls = int(sys.argv[1]) if len(sys.argv) > 1 else 12800
scratch = bytearray(4 << 20)
ones = b"\1" * 64
times: dict[str, list[int]] = {"pooled (session 19)": [], "new_trace_id": []}
clock = time.perf_counter_ns
for i in range(2 * calls):
    scratch[(i * 64) % 65536 :: 65536] = ones  # touch 64 lines spread over the buffer
    label, fn = ("pooled (session 19)", pooled_trace_id) if i % 2 == 0 else ("new_trace_id", new_trace_id)
    t0 = clock()
    fn()
    times[label].append(clock() - t0)
for label, v in times.items():
    v.sort()
    n = len(v)
    print(
        f"{label:20s} p50 {v[n // 2] / 1e3:6.2f} µs  p99 {v[int(0.99 * n)] / 1e3:6.2f}  p99.5 {v[int(0.995 * n)] / 1e3:6.2f}"
        f"  max {v[-1] / 1e3:7.2f}  mean {sum(v) / n / 1e3:6.2f}"
    )
