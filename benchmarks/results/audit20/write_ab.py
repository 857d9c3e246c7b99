"""In-process A/B of the audit writer's ``write`` inside the connector's decision, alternating per decision.

``python benchmarks/results/audit20/write_ab.py [N] [shifted|exact] [hit|miss] [ROUNDS] [VARIANTS]`` from a tree's root:
bench_connector's scheduler (8K prompts, ~10K pinned blocks, a real JSONL file), N decisions per round; each decision
runs with the next variant of ``AuditWriter.write`` in turn (the writer's ``write``, an instance attribute, calls the
variant's function: one type, one file, one process for all). Prints per variant and round the median / p90 / p99 µs of the decision's two
``write`` calls together (timed around each call) and of the whole decision, after the first 200 decisions.

Variants: ``main`` (the tree's ``AuditWriter``); ``bytes`` (each line kept as pydantic's bytes, ``to_json`` of the
record's dict called directly: no decode and re-encode); ``bytesdict`` (``bytes`` with plain dicts for the counters,
the record's fields read from its dict); ``bytesvals`` (``bytes``, the counters' keys read from the record's
dict); ``pair`` (records kept until the flush and serialized in one
``to_json`` of the list, split into lines at ``},{"event":``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, "benchmarks")
import bench_connector as bc
from pydantic_core import to_json

from semblend_dynamo.audit import AuditRecord, AuditWriter
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

ns = time.perf_counter_ns


def write_bytes(self: AuditWriter, record: AuditRecord, /, *, flush: bool = True) -> AuditRecord:
    rec = record
    line = to_json(rec.__dict__, inf_nan_mode="null") + b"\n"
    with self._lock:
        if self._fd is not None:
            self._pending.append(line)  # type: ignore[arg-type]
            if flush:
                send_bytes(self)
        elif self.records is not None:
            self.records.append(rec)
        self.by_event[rec.event] += 1
        if rec.rejection_reason is not None:
            self.by_reason[rec.rejection_reason] += 1
    return rec


def write_bytesdict(self: AuditWriter, record: AuditRecord, /, *, flush: bool = True) -> AuditRecord:
    rec = record
    values = rec.__dict__
    line = to_json(values, inf_nan_mode="null") + b"\n"
    with self._lock:
        if self._fd is not None:
            self._pending.append(line)  # type: ignore[arg-type]
            if flush:
                send_bytes(self)
        elif self.records is not None:
            self.records.append(rec)
        counts = COUNTS
        event = values["event"]
        counts[event] = counts.get(event, 0) + 1
        reason = values.get("rejection_reason")
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    return rec


COUNTS: dict[str, int] = {}


def write_bytesvals(self: AuditWriter, record: AuditRecord, /, *, flush: bool = True) -> AuditRecord:
    rec = record
    values = rec.__dict__
    line = to_json(values, inf_nan_mode="null") + b"\n"
    with self._lock:
        if self._fd is not None:
            self._pending.append(line)  # type: ignore[arg-type]
            if flush:
                send_bytes(self)
        elif self.records is not None:
            self.records.append(rec)
        self.by_event[values["event"]] += 1
        reason = values.get("rejection_reason")
        if reason is not None:
            self.by_reason[reason] += 1
    return rec


def send_bytes(self: AuditWriter) -> None:
    data = b"".join(self._pending)  # type: ignore[arg-type]
    self._pending.clear()
    assert self._fd is not None
    assert os.write(self._fd, data) == len(data)


def write_pair(self: AuditWriter, record: AuditRecord, /, *, flush: bool = True) -> AuditRecord:
    rec = record
    with self._lock:
        if self._fd is not None:
            pending = self._pending
            pending.append(rec.__dict__)  # type: ignore[arg-type]
            if flush:
                if len(pending) == 1:
                    data = to_json(pending[0], inf_nan_mode="null") + b"\n"
                else:
                    data = to_json(pending, inf_nan_mode="null")[1:-1].replace(b'},{"event":', b'}\n{"event":') + b"\n"
                pending.clear()
                assert os.write(self._fd, data) == len(data)
        elif self.records is not None:
            self.records.append(rec)
        self.by_event[rec.event] += 1
        if rec.rejection_reason is not None:
            self.by_reason[rec.rejection_reason] += 1
    return rec


VARIANTS = {
    "main": AuditWriter.write,
    "bytes": write_bytes,
    "pair": write_pair,
    "bytesdict": write_bytesdict,
    "bytesvals": write_bytesvals,
}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    mode = sys.argv[2] if len(sys.argv) > 2 else "shifted"
    case = sys.argv[3] if len(sys.argv) > 3 else "hit"
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    names = sys.argv[5].split(",") if len(sys.argv) > 5 else list(VARIANTS)
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    writer = sched.audit
    spent = [0]
    impl = [AuditWriter.write]

    def timed_write(record: Any = None, /, **kw: Any) -> Any:
        t0 = ns()
        out = impl[0](writer, record, **kw)
        spent[0] += ns() - t0
        return out

    writer.write = timed_write  # type: ignore[method-assign]
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    def q(v: list[int], p: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(len(v) * p))] / 1e3

    block = 20_000
    rid = 10_000_000
    print(f"{mode} {case}, {n} decisions a round, variants in turn per decision; µs p50 / p90 / p99")
    for r in range(rounds):
        writes: dict[str, list[int]] = {k: [] for k in names}
        whole: dict[str, list[int]] = {k: [] for k in names}
        prompts = [prompt() for _ in range(n)]
        for i, tokens in enumerate(prompts):
            name = names[(i + r) % len(names)]
            impl[0] = VARIANTS[name]
            request = HarnessRequest(rid, tokens)
            rid += 1
            spent[0] = 0
            t0 = ns()
            sched.get_num_new_matched_tokens(request, 0)
            t1 = ns()
            if i >= 200:
                writes[name].append(spent[0])
                whole[name].append(t1 - t0)
            sched.update_state_after_alloc(request, list(range(block, block + 256)))
            block += 256
            sched.build_connector_meta(SchedulerOutput())
            sched.request_finished(request, [])
        for k in names:
            w, d = writes[k], whole[k]
            print(
                f"round {r} {k:6s} writes {q(w, 0.5):6.2f} / {q(w, 0.9):6.2f} / {q(w, 0.99):6.2f}"
                f"   decision {q(d, 0.5):6.1f} / {q(d, 0.9):6.1f} / {q(d, 0.99):6.1f}"
            )


if __name__ == "__main__":
    main()
