"""Every decision and audit record of bench_connector's cases, with the per-run values masked, for comparing two trees.

``python benchmarks/results/sched4/decisions_ab.py [N] [file] > decisions.txt`` from a tree's root (its ``benchmarks/``
and packages on the path), once per tree, then ``diff``. For each mode (exact, shifted) it builds bench_connector's
scheduler (2K-token prompts, ~10K pinned blocks, audit in memory) and decides N prompts of each case (miss, hit,
shifted hit, hinted hit, a hint naming a donor that is not there, a hint with spans, a device prefix of 2 and of 5
blocks, a prompt cut one token into its last block), settling each request as the benchmark does. One line per
decision: the tokens promised and every audit record the decision wrote, ``ts``, ``latency_us``, ``trace_id`` and
``run_id`` masked (they differ per run); with ``file``, the records go to a JSONL file and each decision's lines are
printed as written (the same fields masked in the text), so the bytes are compared.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from semblend_dynamo.audit import _FIELDS
from semblend_dynamo.events.schemas import DonorHint, request_key
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

MASKED = ("ts", "latency_us", "trace_id", "run_id")


def record_fields(record: Any) -> dict[str, Any]:
    values = {name: getattr(record, name) for name in _FIELDS}
    return {k: ("X" if k in MASKED and v is not None else v) for k, v in values.items() if v is not None}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    to_file = len(sys.argv) > 2 and sys.argv[2] == "file"
    for mode in ("exact", "shifted"):
        decide_all(mode, n, to_file)


def masked_lines(text: str) -> list[str]:
    text = re.sub(r'"(ts|latency_us)":[0-9.e+-]+', r'"\1":X', text)
    return re.sub(r'"(trace_id|run_id)":"[0-9a-f]+"', r'"\1":"X"', text).splitlines()


def decide_all(mode: str, n: int, to_file: bool) -> None:
    """Print every decision of ``n`` prompts per case in ``mode``."""
    tokens = 2048
    path = Path(tempfile.mkdtemp()) / "audit.jsonl" if to_file else None
    audit = "file" if to_file else "memory"
    args = argparse.Namespace(prompt_tokens=tokens, pinned_blocks=10_000, requests=n, mode=mode, audit=audit)
    sched, donors = bc.build_scheduler(args, path)
    records = sched.audit.records
    assert records is not None or path is not None
    rng = random.Random(7)
    tpb = bc.TPB
    cut = tokens * 3 // 4

    def fresh(k: int) -> list[int]:
        return [rng.randrange(1, 32000) for _ in range(k)]

    def donor_index() -> int:
        return rng.randrange(len(donors))

    def hint(prompt: list[int], index: int, spans: list[tuple[int, int, int]] | None = None) -> None:
        sched.hints.submit(
            DonorHint(
                request_key=request_key(prompt),
                donor_id=sched.registry.donor_id_for(index + 1),
                worker_id=0,
                namespace=sched.model.namespace().digest(),
                decision="semantic_placement",
                spans=spans or [],
            )
        )

    cases: list[tuple[str, list[int], int]] = []  # name, prompt, device-matched tokens
    for _ in range(n):
        cases.append(("miss", fresh(tokens), 0))
        d = donors[donor_index()]
        cases.append(("hit", d[:cut] + fresh(tokens - cut), 0))
        cases.append(("shifted hit", d[40 : 40 + cut] + fresh(tokens - cut), 0))
        cases.append(("device prefix 2 blocks", d[:cut] + fresh(tokens - cut), 2 * tpb))
        cases.append(("device prefix 5 blocks", d[:cut] + fresh(tokens - cut), 5 * tpb))
        cases.append(("cut in a block", d[: cut + 5] + fresh(tokens - cut - 5), 0))
        cases.append(("shared head, shifted tail", d[:768] + fresh(32) + d[900:1924] + fresh(tokens - 1824), 0))
    request_id = 20_000_000
    block = 10_000_000
    for name, prompt, computed in cases:
        index = next((i for i, d in enumerate(donors) if d[:tpb] == prompt[:tpb]), None)
        hinted = rng.random() < 0.3
        if hinted and index is not None:
            spans = [(0, 0, cut)] if rng.random() < 0.5 else None
            hint(prompt, index, spans)
        elif hinted:
            hint(prompt, donor_index())
        request_id += 1
        request = HarnessRequest(request_id, prompt)
        before = path.stat().st_size if path is not None else len(records)  # type: ignore[arg-type]
        promised, _ = sched.get_num_new_matched_tokens(request, computed)
        if path is not None:
            with path.open("rb") as f:
                f.seek(before)
                lines: list[Any] = masked_lines(f.read().decode())
        else:
            lines = [record_fields(r) for r in records[before:]]  # type: ignore[index]
        print(f"{mode} | {name} | hinted {hinted} | promised {promised} | {lines}")
        blocks = list(range(block, block + -(-len(prompt) // tpb)))
        block += len(blocks)
        sched.update_state_after_alloc(request, blocks)
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])


if __name__ == "__main__":
    main()
