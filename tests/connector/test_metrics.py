"""The per-decision metrics: plain counts per scheduler, summed at scrape time into the same exposition as
prometheus_client's own Counter / Histogram would give for the same events."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from trtllm_connector import metrics

from .conftest import prompt

BUCKETS = (25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 5e-3, 2e-2)
# Latencies exactly on, between and past the bounds; dyadic ones add up exactly in any order (several schedulers).
ON_BOUNDS = (25e-6, 3e-4, 2e-2, 0.5, 1e-3, 0.0)
DYADIC = (2**-16, 2**-12, 2**-6, 2**-1, 2**-10, 0.0)


def events(latencies: tuple[float, ...]) -> list[tuple[str, object]]:
    """(event, argument): what a scheduler records, in order."""
    return [
        ("promised", 4096),
        ("observe", latencies[0]),
        ("declined", "no_candidates"),
        ("observe", latencies[1]),
        ("promised", 8192),
        ("observe", latencies[2]),
        ("cancelled", "load_cancelled"),
        ("declined", "below_min_reuse"),
        ("observe", latencies[3]),
        ("declined", "no_candidates"),
        ("observe", latencies[4]),
        ("observe", latencies[5]),
    ]


class Reference:
    """The connector's per-decision metrics as prometheus_client objects (the definitions before session 20)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "semblend_connector_decisions_total",
            "get_num_new_matched_tokens decisions by outcome and decline reason",
            ["outcome", "reason"],
            registry=registry,
        )
        self.tokens = Counter(
            "semblend_connector_promised_tokens_total", "tokens promised to TensorRT-LLM", registry=registry
        )
        self.latency = Histogram(
            "semblend_connector_decision_seconds",
            "time spent in get_num_new_matched_tokens",
            buckets=BUCKETS,
            registry=registry,
        )

    def scheduler(self) -> None:
        self.decisions.labels("promised", "")

    def apply(self, event: str, arg: object) -> None:
        if event == "promised":
            self.decisions.labels("promised", "").inc()
            self.tokens.inc(arg)  # type: ignore[arg-type]
        elif event == "observe":
            self.latency.observe(arg)  # type: ignore[arg-type]
        else:
            self.decisions.labels(event, arg).inc()


def apply(stats: metrics.DecisionStats, event: str, arg: object) -> None:
    """As the scheduler does."""
    if event == "promised":
        stats.promised += 1
        stats.promised_tokens += arg  # type: ignore[operator]
    elif event == "observe":
        stats.observe(arg)  # type: ignore[arg-type]
    else:
        stats.count(event, arg)  # type: ignore[arg-type]


def summed(book: metrics.DecisionBook) -> CollectorRegistry:
    registry = CollectorRegistry()
    for family in book.families():
        registry.register(family)
    return registry


@pytest.fixture()
def frozen_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One wall clock for every ``_created`` sample."""
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.25)


@pytest.mark.parametrize(("sources", "latencies"), [(1, ON_BOUNDS), (1, DYADIC), (3, DYADIC)])
def test_exposition_equals_prometheus_client(frozen_time: None, sources: int, latencies: tuple[float, ...]) -> None:
    ref_registry = CollectorRegistry()
    ref = Reference(ref_registry)
    book = metrics.DecisionBook()
    ours = summed(book)
    assert generate_latest(ours) == generate_latest(ref_registry)  # no scheduler yet: empty families
    stats = []
    for _ in range(sources):
        stats.append(book.stats())
        ref.scheduler()
    for i, (event, arg) in enumerate(events(latencies) * 3):
        apply(stats[i % sources], event, arg)
        ref.apply(event, arg)
        assert generate_latest(ours) == generate_latest(ref_registry)
    assert generate_openmetrics(ours) == generate_openmetrics(ref_registry)
    assert ref_registry.get_sample_value("semblend_connector_decision_seconds_count") == 18


def test_created_series_follow_prometheus_client(frozen_time: None, monkeypatch: pytest.MonkeyPatch) -> None:
    ref_registry = CollectorRegistry()
    ref = Reference(ref_registry)
    book = metrics.DecisionBook()
    ours = summed(book)
    ref.scheduler()
    apply(book.stats(), "declined", "no_candidates")
    ref.apply("declined", "no_candidates")
    assert b"_created" in generate_latest(ours)
    monkeypatch.setattr(prometheus_metrics, "_use_created", False)  # what disable_created_metrics() sets
    text = generate_latest(ours)
    assert text == generate_latest(ref_registry) and b"_created" not in text


def test_module_families_keep_names_and_order() -> None:
    families = [(f.name, f.type) for f in REGISTRY.collect() if f.name.startswith("semblend_connector_")]
    assert families == [
        ("semblend_connector_decisions", "counter"),
        ("semblend_connector_promised_tokens", "counter"),
        ("semblend_connector_materialized_tokens", "counter"),
        ("semblend_connector_donors", "counter"),
        ("semblend_connector_pinned_blocks", "gauge"),
        ("semblend_connector_decision_seconds", "histogram"),
    ]


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_decisions_of_several_schedulers_are_summed(make_harness) -> None:
    promised = {"outcome": "promised", "reason": ""}
    before = (
        _sample("semblend_connector_decision_seconds_count"),
        _sample("semblend_connector_decisions_total", promised),
        _sample("semblend_connector_promised_tokens_total"),
    )
    harnesses = [make_harness(num_blocks=128) for _ in range(3)]
    results = []
    for i, h in enumerate(harnesses):
        donor = prompt(300 + i, 100)
        results += [h.run_request(donor), h.run_request(donor[:64] + prompt(310 + i, 20))]
    del harnesses  # a scheduler gone keeps its counts in the process's totals
    hits = [r for r in results if r.promised]
    assert hits
    after = (
        _sample("semblend_connector_decision_seconds_count"),
        _sample("semblend_connector_decisions_total", promised),
        _sample("semblend_connector_promised_tokens_total"),
    )
    assert after[0] - before[0] == len(results)
    assert after[1] - before[1] == len(hits)
    assert after[2] - before[2] == sum(r.promised for r in hits)


def test_scrape_concurrent_with_decisions_loses_nothing() -> None:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter lets it
    book = metrics.DecisionBook()
    registry = summed(book)
    rounds = 20_000
    reasons = [f"reason_{i}" for i in range(50)]  # new series appear while scrapes read them

    def decide() -> None:
        stats = book.stats()
        for i in range(rounds):
            if i % 2:
                stats.promised += 1
                stats.promised_tokens += 16
            else:
                stats.count("declined", reasons[i % 100 // 2])
            stats.observe(1e-3 if i % 3 else 1e-5)

    def totals() -> tuple[float, float, float, float]:
        samples = [s for family in registry.collect() for s in family.samples if not s.name.endswith("_created")]
        outcomes = [(s.labels.get("outcome"), s.value) for s in samples]
        counts = {s.name: s.value for s in samples if s.name.endswith(("_count", "tokens_total"))}
        return (
            sum(v for outcome, v in outcomes if outcome == "promised"),
            sum(v for outcome, v in outcomes if outcome == "declined"),
            counts.get("semblend_connector_promised_tokens_total", 0.0),
            counts.get("semblend_connector_decision_seconds_count", 0.0),
        )

    writers = [threading.Thread(target=decide) for _ in range(2)]
    try:
        for w in writers:
            w.start()
        seen = (0.0, 0.0, 0.0, 0.0)
        scrapes = 0
        while any(w.is_alive() for w in writers):
            now = totals()
            assert all(a >= b for a, b in zip(now, seen, strict=True)), (now, seen)  # counters never go back
            seen = now
            scrapes += 1
        for w in writers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    assert scrapes > 1
    assert totals() == (rounds, rounds, rounds * 16, 2 * rounds)


def test_multiprocess_mode_gets_a_warning_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert metrics.multiprocess_warning() is None
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/nonexistent-metrics-dir")
    line = metrics.multiprocess_warning()
    assert line is not None and "PROMETHEUS_MULTIPROC_DIR" in line and "semblend_connector_decisions" in line
