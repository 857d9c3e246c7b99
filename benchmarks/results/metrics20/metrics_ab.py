"""This tree's per-decision metrics (plain counts summed at scrape time) against a base tree's (prometheus_client
Counter / Histogram updates), in one process, the variant chosen per decision (metrics20).

``python benchmarks/results/metrics20/metrics_ab.py BASE_TREE [N] [hit|shifted-hit|miss]`` from this tree's root (its
packages on the path, its compiled modules built). The two trees may differ only in ``trtllm_connector/connector.py``
and ``trtllm_connector/metrics.py`` (checked: every other source file of the packages must be byte-identical). The
base's ``metrics.py`` is loaded as ``trtllm_connector._base_metrics`` (its prometheus_client metrics kept out of the
default registry, whose names this tree's collectors hold; updating them costs the same registered or not) and its
``connector.py`` as ``trtllm_connector._base_connector`` (relative imports: this tree's other modules, which are the
base's), its ``metrics`` the base's. One bench_connector scheduler (8K prompts, ~10K pinned blocks, shifted mode,
audit to a file) runs every decision; for each pair of decisions a seeded coin says which variant goes first, and the
scheduler's class is set to that variant's ``SemBlendConnectorScheduler`` for the decision and its settle calls.
An A/A run (BASE_TREE ``.``) shows the method's own bias. Prints per variant the decision's p50 / p90 / p99 (µs) over the decisions after the first 200, the median of the
per-pair difference (base - this), and the tokens each variant promised.
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

VARIANT_FILES = {"trtllm_connector/connector.py", "trtllm_connector/metrics.py"}


def same_elsewhere(base: Path) -> None:
    for package in ("trtllm_connector", "semblend_dynamo", "kernels"):
        for path in sorted(Path(package).rglob("*.py")):
            if path.as_posix() not in VARIANT_FILES:
                assert filecmp.cmp(path, base / path, shallow=False), f"{path} differs: the A/B would not be sound"


def load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"trtllm_connector.{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def main() -> None:
    base = Path(sys.argv[1]).resolve()
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    case = sys.argv[3] if len(sys.argv) > 3 else "hit"
    same_elsewhere(base)
    REGISTRY.register = lambda collector: None  # type: ignore[method-assign]  # the base's metrics: unregistered
    try:
        base_metrics = load("_base_metrics", base / "trtllm_connector" / "metrics.py")
    finally:
        del REGISTRY.register
    base_connector = load("_base_connector", base / "trtllm_connector" / "connector.py")
    base_connector.metrics = base_metrics
    classes = {"this": connector.SemBlendConnectorScheduler, "base": base_connector.SemBlendConnectorScheduler}

    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode="shifted", audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    if hasattr(base_metrics, "decisions"):  # main's __init__ sets this (an A/A run, BASE_TREE ".", has none)
        sched._promised_counter = base_metrics.decisions("promised")
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
        sched.__class__ = classes[label]  # type: ignore[assignment]
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
            f"{label}: decision p50 {q(v, 0.5):.1f} p90 {q(v, 0.9):.1f} p99 {q(v, 0.99):.1f} µs;"
            f" promised {sum(r[1] for r in rows)} tokens in {len(rows)} decisions"
        )
    print(f"base - this per pair: median {q(diffs, 0.5):.2f} µs (p25 {q(diffs, 0.25):.2f}, p75 {q(diffs, 0.75):.2f})")


if __name__ == "__main__":
    main()
