"""This tree's audit module against a base tree's, in one process, alternating per connector decision.

``python benchmarks/results/audit20/audit_ab.py BASE_TREE [N] [shifted|exact] [hit|miss] [ROUNDS]`` from this tree's
root: bench_connector's scheduler (8K prompts, ~10K pinned blocks, a real JSONL file); the base tree's
``semblend_dynamo/audit.py`` is loaded as a second module. Each decision runs either with this tree's ``AuditRecord``
and ``AuditWriter`` or with the base's (the connector module's ``AuditRecord`` and the scheduler's writer swapped,
both writers appending to one file), in turns, the first variant swapped each round. Prints per variant and round the
median / p90 / p99 µs of the decision's two ``write`` calls together (a timer around each) and of the whole decision,
over the decisions after the first 200.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo import audit as this_audit
from trtllm_connector import connector as cm
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

ns = time.perf_counter_ns


def load_base(tree: str) -> Any:
    spec = importlib.util.spec_from_file_location("semblend_dynamo._audit_base", f"{tree}/semblend_dynamo/audit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    base_audit = load_base(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    mode = sys.argv[3] if len(sys.argv) > 3 else "shifted"
    case = sys.argv[4] if len(sys.argv) > 4 else "hit"
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    path = Path(tempfile.mkdtemp()) / "audit.jsonl"
    sched, donors = bc.build_scheduler(args, path)
    spent = [0]

    def timed(writer: Any) -> Any:
        """The writer with its ``write`` timed (an instance attribute, for both writers alike)."""
        write = type(writer).write

        def timed_write(record: Any = None, /, **kw: Any) -> Any:
            t0 = ns()
            out = write(writer, record, **kw)
            spent[0] += ns() - t0
            return out

        writer.write = timed_write
        return writer

    variants = {
        "this": (this_audit.AuditRecord, timed(sched.audit)),
        "base": (base_audit.AuditRecord, timed(base_audit.AuditWriter(path))),
    }
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

    names = list(variants)
    block, rid = 20_000, 10_000_000
    print(f"{mode} {case}, {n} decisions a round, this tree and the base in turns per decision; µs p50 / p90 / p99")
    for r in range(rounds):
        writes: dict[str, list[int]] = {k: [] for k in names}
        whole: dict[str, list[int]] = {k: [] for k in names}
        for i, tokens in enumerate([prompt() for _ in range(n)]):
            name = names[(i + r) % 2]
            cm.AuditRecord, sched.audit = variants[name]
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
                f"round {r} {k:4s} writes {q(w, 0.5):6.2f} / {q(w, 0.9):6.2f} / {q(w, 0.99):6.2f}"
                f"   decision {q(d, 0.5):6.1f} / {q(d, 0.9):6.1f} / {q(d, 0.99):6.1f}"
            )


if __name__ == "__main__":
    main()
