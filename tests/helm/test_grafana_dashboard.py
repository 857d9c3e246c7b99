"""deploy/grafana/semblend-dynamo.json: every PromQL query names metrics the router or the connector exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

import trtllm_connector.metrics  # noqa: F401  (registers the connector's metrics in the default registry)
from semblend_dynamo.router.metrics import RouterMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "semblend-dynamo.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def exported(registry: CollectorRegistry, prefix: str) -> set[str]:
    """The series names a registry exposes for its ``prefix`` metrics (counters as ``_total``, histograms' parts)."""
    names = set()
    for family in registry.collect():
        if family.name.startswith(prefix):
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left once strings, label matchers, ranges, groupings,
    numbers and function calls are taken out."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$__\w+", "", expr)
    idents = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*(?!\s*\()(?![A-Za-z0-9_:])", expr)
    return {name for name in idents if name not in PROMQL_WORDS}


def queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from queries(value)


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'sum(increase(a_total{decision="x"}[$__range])) / clamp_min(sum by (w) (rate(b_bucket[5m])), 1)'
        " + histogram_quantile(0.99, c_sum) + min(d)"
    )
    assert metric_names(expr) == {"a_total", "b_bucket", "c_sum", "d"}


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = exported(RouterMetrics().registry, "semblend_router_") | exported(REGISTRY, "semblend_connector_")
    exprs = list(queries(dashboard))
    assert len(exprs) >= 10
    used = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= known, f"{expr!r} names {sorted(names - known)}, not exported"
        used |= names
    # the per-worker evidence-vs-confirmed pair is on the dashboard
    assert {"semblend_router_hinted_blocks_total", "semblend_router_backend_confirmed_blocks_total"} <= used


def test_panels_use_the_datasource_variable_and_do_not_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
        pos = panel["gridPos"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not mine & cells, panel["title"]
        assert pos["x"] + pos["w"] <= 24
        cells |= mine
