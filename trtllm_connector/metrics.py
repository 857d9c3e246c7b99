"""Prometheus metrics of the connector (process-wide, registered once on import).

The per-decision families (decisions, promised tokens, decision latency) are plain numbers in each scheduler's
``DecisionStats``, summed over every scheduler of the process by collectors when scraped: a decision does a few
``+=`` instead of prometheus_client's lock and value class per update. The exposition is the one prometheus_client's
``Counter`` / ``Histogram`` give for the same events (names, help, types, labels, buckets, ``_created``). The donor
and worker families, off the decision's path, are prometheus_client metrics.

Threading rule: a ``DecisionStats`` has one writer, its scheduler (whose calls all come from TensorRT-LLM's executor
thread, as its other state requires); a scrape, from another thread, only reads. Each update is one ``+=`` on an
attribute, list item or dict item, so a scrape sees it whole or not at all, and no count is lost (no other thread
writes that number). A scrape may see an observation in the buckets and not yet in ``_sum`` (so may
prometheus_client's histogram, whose sum and buckets have separate locks); the next scrape has it. A scheduler's
stats stay in the book for the life of the process (a gone scheduler's counts stay in the totals; a few hundred
bytes each).
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable, Iterable

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString

DECISIONS_NAME = "semblend_connector_decisions"
TOKENS_NAME = "semblend_connector_promised_tokens"
LATENCY_NAME = "semblend_connector_decision_seconds"
HELP = {
    DECISIONS_NAME: "get_num_new_matched_tokens decisions by outcome and decline reason",
    TOKENS_NAME: "tokens promised to TensorRT-LLM",
    LATENCY_NAME: "time spent in get_num_new_matched_tokens",
}
LATENCY_BOUNDS = (25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 5e-3, 2e-2, INF)
_PROMISED = ("promised", "")


class DecisionStats:
    """One scheduler's per-decision counts; the scheduler is its only writer."""

    __slots__ = ("_book", "latency", "latency_sum", "outcomes", "promised", "promised_tokens")

    def __init__(self, book: DecisionBook) -> None:
        self._book = book
        self.promised = 0  # decisions{outcome="promised"}
        self.promised_tokens = 0
        self.outcomes: dict[tuple[str, str], int] = {}  # the other decisions, by (outcome, reason)
        self.latency = [0] * len(LATENCY_BOUNDS)  # observations per bucket (not cumulative)
        self.latency_sum = 0.0

    def count(self, outcome: str, reason: str) -> None:
        key = (outcome, reason)
        if key in self.outcomes:
            self.outcomes[key] += 1
        else:
            self._book.series.setdefault(key, time.time())  # listed before counted: a scrape never skips a count
            self.outcomes[key] = 1

    def observe(self, seconds: float) -> None:
        self.latency[bisect.bisect_left(LATENCY_BOUNDS, seconds)] += 1  # the first bound >= seconds, as `le`
        self.latency_sum += seconds


class DecisionBook:
    """Every scheduler's ``DecisionStats`` in a process and the series seen so far; builds the summed families."""

    def __init__(self) -> None:
        self.created = time.time()  # of the unlabelled families
        self.sources: list[DecisionStats] = []
        self.series: dict[tuple[str, str], float] = {}  # (outcome, reason) -> created, in order of first use

    def stats(self) -> DecisionStats:
        """A new scheduler's stats (its ``promised`` series exists from now on, at 0)."""
        stats = DecisionStats(self)
        self.series.setdefault(_PROMISED, time.time())
        self.sources.append(stats)
        return stats

    def families(self) -> tuple[Collector, ...]:
        """Collectors of the decisions, promised-tokens and latency families, in that order."""
        return (
            _Family(self._decisions, DECISIONS_NAME, "counter"),
            _Family(self._tokens, TOKENS_NAME, "counter"),
            _Family(self._latency, LATENCY_NAME, "histogram"),
        )

    def _decisions(self, metric: Metric, created: bool) -> None:
        series = list(self.series.items())  # read before the counts (see count)
        sources = tuple(self.sources)
        outcomes = [s.outcomes.copy() for s in sources]
        for key, since in series:
            value = sum(s.promised for s in sources) if key == _PROMISED else sum(o.get(key, 0) for o in outcomes)
            labels = {"outcome": key[0], "reason": key[1]}
            metric.add_sample(DECISIONS_NAME + "_total", labels, float(value))
            if created:
                metric.add_sample(DECISIONS_NAME + "_created", labels, since)

    def _tokens(self, metric: Metric, created: bool) -> None:
        metric.add_sample(TOKENS_NAME + "_total", {}, float(sum(s.promised_tokens for s in tuple(self.sources))))
        if created:
            metric.add_sample(TOKENS_NAME + "_created", {}, self.created)

    def _latency(self, metric: Metric, created: bool) -> None:
        sources = tuple(self.sources)
        buckets = [list(s.latency) for s in sources]
        total = sum(s.latency_sum for s in sources)
        cumulative = 0.0
        for i, bound in enumerate(LATENCY_BOUNDS):
            cumulative += sum(b[i] for b in buckets)
            metric.add_sample(LATENCY_NAME + "_bucket", {"le": floatToGoString(bound)}, cumulative)
        metric.add_sample(LATENCY_NAME + "_count", {}, cumulative)
        metric.add_sample(LATENCY_NAME + "_sum", {}, float(total))
        if created:
            metric.add_sample(LATENCY_NAME + "_created", {}, self.created)


class _Family(Collector):
    """One summed family, as prometheus_client's metric of that name would collect it."""

    def __init__(self, samples: Callable[[Metric, bool], None], name: str, kind: str) -> None:
        self._samples = samples
        self._name = name
        self._kind = kind
        self._help = HELP[name]

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._help, self._kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self._name, self._help, self._kind)
        self._samples(metric, getattr(prometheus_metrics, "_use_created", True))  # disable_created_metrics() clears it
        return [metric]


def multiprocess_warning() -> str | None:
    """The line to log when prometheus_client runs in multiprocess mode, which reads only its own metrics' files."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    return (
        "semblend connector metrics: PROMETHEUS_MULTIPROC_DIR is set, but the per-decision families "
        f"({DECISIONS_NAME}, {TOKENS_NAME}, {LATENCY_NAME}) are kept in this process, not in multiprocess files: "
        "scrape this process's default registry to see them"
    )


BOOK = DecisionBook()
DECISIONS, PROMISED_TOKENS, DECISION_LATENCY = BOOK.families()
REGISTRY.register(DECISIONS)
REGISTRY.register(PROMISED_TOKENS)
MATERIALIZED_TOKENS = Counter(
    "semblend_connector_materialized_tokens_total",
    "tokens whose donor KV copy completed on the device, by lineage (exact / approximate)",
    ["lineage"],
)
DONORS = Counter("semblend_connector_donors_total", "donor lifecycle transitions", ["event"])
PINNED_BLOCKS = Gauge("semblend_connector_pinned_blocks", "blocks held by pinned donors (incl. pending release)")
REGISTRY.register(DECISION_LATENCY)
if (_MULTIPROCESS := multiprocess_warning()) is not None:
    logging.getLogger(__name__).warning(_MULTIPROCESS)
