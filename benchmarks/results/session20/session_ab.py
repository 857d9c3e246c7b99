"""This session's connector against the session's starting main, in one process, the tree chosen per decision.

``python benchmarks/results/session20/session_ab.py BASE_TREE [N] [hit|shifted-hit|miss]`` from this tree's root (its
packages on the path, its compiled modules built). The trees may differ only in ``trtllm_connector/connector.py``,
``trtllm_connector/metrics.py`` and ``semblend_dynamo/audit.py`` (checked: every other source file of the packages is
byte-identical). metrics20's method (``benchmarks/results/metrics20/metrics_ab.py``) widened to the audit module: the
base's ``audit.py``, ``metrics.py`` and ``connector.py`` are loaded under other names (the connector's imports bound
to the base's audit and metrics while it loads; the base's prometheus metrics kept out of the default registry), and
for each decision the scheduler's class and its audit writer's class are set to the variant's (the writer holds no
line between decisions: each decision's verdict sends them). One bench_connector scheduler (8K prompts, ~10K pinned
blocks, shifted mode, audit to a file); a seeded coin per pair of decisions says which variant goes first. An A/A run
(BASE_TREE ``.``) shows the method's own bias. Prints per variant the decision's p50 / p90 / p99 / p99.5 (µs) over the
decisions after the first 200, the median of the per-pair difference (base - this), and the tokens each promised.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import random
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, "benchmarks")
import bench_connector as bc
from prometheus_client import REGISTRY

from trtllm_connector import connector
from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

VARIANT_FILES = {"trtllm_connector/connector.py", "trtllm_connector/metrics.py", "semblend_dynamo/audit.py"}


def same_elsewhere(base: Path) -> None:
    for package in ("trtllm_connector", "semblend_dynamo", "kernels"):
        for path in sorted(Path(package).rglob("*.py")):
            if path.as_posix() not in VARIANT_FILES:
                assert filecmp.cmp(path, base / path, shallow=False), f"{path} differs: the A/B would not be sound"


def load(name: str, path: Path, bound: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
    """``path`` as module ``name``; while it runs, ``bound`` stands in for those modules (its imports get them)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    saved = {k: sys.modules[k] for k in bound or {}}
    sys.modules.update(bound or {})
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.update(saved)
    return module


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def main() -> None:
    base = Path(sys.argv[1]).resolve()
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    case = sys.argv[3] if len(sys.argv) > 3 else "hit"
    same_elsewhere(base)
    base_audit = load("semblend_dynamo._base_audit", base / "semblend_dynamo" / "audit.py")
    REGISTRY.register = lambda collector: None  # type: ignore[method-assign]  # the base's metrics: unregistered
    try:
        base_metrics = load("trtllm_connector._base_metrics", base / "trtllm_connector" / "metrics.py")
    finally:
        del REGISTRY.register
    base_connector = load(
        "trtllm_connector._base_connector",
        base / "trtllm_connector" / "connector.py",
        {"semblend_dynamo.audit": base_audit, "trtllm_connector.metrics": base_metrics},
    )
    base_connector.metrics = base_metrics  # `from . import metrics` took the package's attribute, this tree's
    schedulers = {"this": connector.SemBlendConnectorScheduler, "base": base_connector.SemBlendConnectorScheduler}

    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    writers = {"this": type(sched.audit), "base": base_audit.AuditWriter}
    if hasattr(base_metrics, "decisions"):  # the base's __init__ sets this (an A/A run, BASE_TREE ".", has none)
        sched._promised_counter = base_metrics.decisions("promised")
    if not hasattr(sched, "_stats"):
        raise SystemExit("this tree's scheduler has no _stats: run from the newer tree")
    rng = random.Random(1)
    cut = 8192 * 3 // 4
    start = {"hit": 0, "shifted-hit": bc.TPB + bc.TPB // 4}.get(case)

    def prompt() -> list[int]:
        if start is None:
            return [rng.randrange(1, 32000) for _ in range(8192)]
        return rng.choice(donors)[start : start + cut] + [rng.randrange(1, 32000) for _ in range(8192 - cut)]

    prompts = [prompt() for _ in range(n)]
    coin = random.Random(2)
    clock = time.perf_counter_ns
    results: dict[str, list[tuple[float, int]]] = {"this": [], "base": []}
    pair: dict[str, float] = {}
    diffs: list[float] = []
    block = 20_000
    order = ("this", "base")
    for i, tokens in enumerate(prompts):
        if i % 2 == 0:
            order = ("this", "base") if coin.random() < 0.5 else ("base", "this")
        label = order[i % 2]
        sched.__class__ = schedulers[label]  # type: ignore[assignment]
        sched.audit.__class__ = writers[label]
        request = HarnessRequest(10_000_000 + i, tokens)
        t0 = clock()
        promised, _ = sched.get_num_new_matched_tokens(request, 0)
        t1 = clock()
        if i >= 200:
            results[label].append(((t1 - t0) / 1e3, promised))
            pair[label] = (t1 - t0) / 1e3
            if i % 2:
                diffs.append(pair["base"] - pair["this"])
        sched.update_state_after_alloc(request, list(range(block, block + 256)))
        block += 256
        sched.build_connector_meta(SchedulerOutput())
        sched.request_finished(request, [])
    print(f"case {case}, {n} decisions, the variant per decision by a coin per pair (first 200 not counted)")
    for label, rows in results.items():
        v = [r[0] for r in rows]
        print(
            f"{label}: decision p50 {q(v, 0.5):.1f} p90 {q(v, 0.9):.1f} p99 {q(v, 0.99):.1f} p99.5 {q(v, 0.995):.1f} µs;"
            f" promised {sum(r[1] for r in rows)} tokens in {len(rows)} decisions"
        )
    print(f"base - this per pair: median {q(diffs, 0.5):.2f} µs (p25 {q(diffs, 0.25):.2f}, p75 {q(diffs, 0.75):.2f})")


if __name__ == "__main__":
    main()
