"""The audit lines of a fixed harness scenario, with the per-run values masked, for comparing two trees.

``python benchmarks/results/sched3/audit_lines.py > lines.txt`` from a tree's root (its packages on the path), once per
tree, then ``diff``: exact and shifted mode, a donor, a hit, a miss, a too-short prompt, a shifted span with output
tokens and a salted request; ``ts``, ``latency_us``, ``trace_id`` and ``run_id`` are masked (they differ per run).
"""

from __future__ import annotations

import random
import re
import tempfile
from pathlib import Path

from semblend_dynamo.audit import AuditWriter
from semblend_dynamo.config import SemblendConfig
from trtllm_connector.harness import PyExecutorHarness


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 4000) for _ in range(n)]


def main() -> None:
    for shifted in (False, True):
        path = Path(tempfile.mkdtemp()) / "audit.jsonl"
        mode = {"exact_materialization_only": False, "isolation": "no_block_reuse"} if shifted else {}
        cfg = SemblendConfig(
            block_size=8, min_span_tokens=16, min_donor_tokens=32, min_reuse_ratio=0.1, pin_budget_fraction=0.5, **mode
        )
        h = PyExecutorHarness.with_stand_in(cfg, num_blocks=256, audit=AuditWriter(path))
        donor = prompt(1, 100)
        h.run_request(donor)
        h.run_request(donor[:64] + prompt(2, 20))
        h.run_request(prompt(3, 100))
        h.run_request(prompt(4, 5))
        h.run_request(prompt(9, 8) + donor[8:72] + prompt(5, 20), output_tokens=3)
        h.run_request(donor[:64] + prompt(6, 20), cache_salt="t|1")
        h.scheduler.audit.close()
        for line in path.open():
            line = re.sub(r'"(ts|latency_us)":[0-9.e+-]+', r'"\1":X', line)
            print(re.sub(r'"(trace_id|run_id)":"[0-9a-f]+"', r'"\1":"X"', line), end="")


if __name__ == "__main__":
    main()
