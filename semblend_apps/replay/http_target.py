"""``semblend-dynamo replay --target URL``: the bundled workload through a running OpenAI endpoint.

Donors first, then the target requests, one at a time, as ``/v1/completions`` with the workload's token ids as the
prompt (no detokenize/retokenize round trip) and the tenant as ``nvext.cache_salt``. The outcome table comes from
the router's own records: the difference of its ``/metrics`` counters before and after the run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field
from tqdm import tqdm

from semblend_dynamo.config import config_from_args
from semblend_dynamo.tokenizer import TokenizerAdapter

from .workload import build_workload

T = TypeVar("T")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
REQUEST_TIMEOUT_S = 60.0


class TargetReport(BaseModel):
    """What one run through an HTTP endpoint produced."""

    target: str
    model: str
    sent: int = 0
    http_status: dict[str, int] = Field(default_factory=dict)
    cached_tokens_by_kind: dict[str, int] = Field(default_factory=dict)
    requests_by_kind: dict[str, int] = Field(default_factory=dict)
    router_outcomes: dict[str, int] = Field(default_factory=dict)
    router_declines: dict[str, int] = Field(default_factory=dict)
    blocks_by_worker: dict[str, dict[str, int]] = Field(default_factory=dict)
    router_metrics: str | None = None


def scrape(metrics_url: str) -> Samples:
    """Every sample of a Prometheus exposition, keyed by (name, sorted labels)."""
    url = metrics_url if metrics_url.endswith("/metrics") else metrics_url.rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return samples


def _delta(before: Samples, after: Samples, name: str, label: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for (sample, labels), value in after.items():
        if sample != name:
            continue
        grown = round(value - before.get((sample, labels), 0.0))
        if grown:
            out[dict(labels)[label]] = grown
    return out


def _blocks_by_worker(before: Samples, after: Samples) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for (sample, labels), value in after.items():
        grown = round(value - before.get((sample, labels), 0.0))
        if not grown:
            continue
        tags = dict(labels)
        if sample == "semblend_router_hinted_blocks_total":
            column = "placed" if tags["decision"] == "semantic_placement" else "hinted_only"
        elif sample == "semblend_router_backend_confirmed_blocks_total":
            column = "confirmed"
        else:
            continue
        row = table.setdefault(tags["worker_id"], {})
        row[column] = row.get(column, 0) + grown
    return table


def served_model(target: str) -> str:
    with urllib.request.urlopen(f"{target}/v1/models", timeout=5) as resp:
        models = json.loads(resp.read()).get("data", [])
    if not models:
        raise RuntimeError(f"{target}/v1/models lists no model")
    return str(models[0]["id"])


def complete(target: str, model: str, tokens: list[int], tenant: str) -> tuple[int, int]:
    """One completion; returns (HTTP status, cached prompt tokens the server reported)."""
    body = {"model": model, "prompt": tokens, "max_tokens": 2}
    req = urllib.request.Request(
        f"{target}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
            usage = json.loads(resp.read()).get("usage") or {}
    except urllib.error.HTTPError as exc:
        return exc.code, 0
    details = usage.get("prompt_tokens_details") or {}
    return 200, int(details.get("cached_tokens") or 0)


def progress(items: list[T], what: str) -> Iterator[T]:
    """A bar on a terminal; off a terminal, a line about every tenth of the run."""
    if sys.stderr.isatty():
        yield from tqdm(items, desc=what, unit="req", file=sys.stderr, leave=False)
        return
    step = max(1, len(items) // 10)
    t0 = time.monotonic()
    for i, item in enumerate(items, 1):
        yield item
        if i % step == 0 or i == len(items):
            print(f"replay: {what} {i}/{len(items)} ({time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)


def run_target(
    target: str,
    *,
    router_metrics: str | None,
    model: str | None,
    block_size: int,
    units: int,
    seed: int,
) -> TargetReport:
    target = target.rstrip("/").removesuffix("/v1")
    workload = build_workload(TokenizerAdapter.bundled(), block_size=block_size, units=units, seed=seed)
    report = TargetReport(target=target, model=model or served_model(target), router_metrics=router_metrics)
    before = scrape(router_metrics) if router_metrics else {}
    status: Tally[str] = Tally()
    sends: list[tuple[str, list[int], str]] = [("donor", d.tokens, d.tenant) for d in workload.donors]
    sends += [(r.kind.value, r.tokens, r.tenant) for r in workload.requests]
    for kind, tokens, tenant in progress(sends, "requests"):
        code, cached = complete(target, report.model, tokens, tenant)
        status[str(code)] += 1
        report.requests_by_kind[kind] = report.requests_by_kind.get(kind, 0) + 1
        report.cached_tokens_by_kind[kind] = report.cached_tokens_by_kind.get(kind, 0) + cached
    report.sent = len(sends)
    report.http_status = dict(sorted(status.items()))
    if router_metrics:
        time.sleep(0.5)  # outcome reports and the last evidence land asynchronously
        after = scrape(router_metrics)
        report.router_outcomes = _delta(before, after, "semblend_router_decisions_total", "outcome")
        report.router_declines = _delta(before, after, "semblend_router_semantic_declines_total", "reason")
        report.blocks_by_worker = _blocks_by_worker(before, after)
    return report


def _rows(header: tuple[str, ...], rows: Iterable[tuple[object, ...]]) -> list[str]:
    table = [header, *[tuple(str(c) for c in r) for r in rows]]
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]


def format_target_report(report: TargetReport) -> str:
    statuses = ", ".join(f"HTTP {code}: {n}" for code, n in report.http_status.items())
    lines = [f"replay through {report.target} (model {report.model}): {report.sent} requests; {statuses}", ""]
    lines += _rows(
        ("kind", "requests", "cached tokens (server)"),
        ((k, n, report.cached_tokens_by_kind.get(k, 0)) for k, n in report.requests_by_kind.items()),
    )
    if report.router_metrics is None:
        lines += ["", "router outcomes: pass --router-metrics URL (the router's metrics port) to read its records"]
        return "\n".join(lines)
    lines += ["", f"router outcomes (its own counters at {report.router_metrics}, this run):"]
    lines += _rows(("outcome", "requests"), sorted(report.router_outcomes.items()))
    if report.router_declines:
        lines += ["", "semantic declines:"]
        lines += _rows(("reason", "requests"), sorted(report.router_declines.items()))
    lines += ["", "blocks per worker (semantic evidence vs backend-confirmed):"]
    lines += _rows(
        ("worker", "hinted+placed", "hinted only", "backend confirmed"),
        (
            (w, row.get("placed", 0), row.get("hinted_only", 0), row.get("confirmed", 0))
            for w, row in sorted(report.blocks_by_worker.items())
        ),
    )
    return "\n".join(lines)


def main_target(args: argparse.Namespace) -> int:
    """Called by ``replay`` when ``--target`` is given."""
    try:
        report = run_target(
            args.target,
            router_metrics=args.router_metrics,
            model=args.model,
            block_size=config_from_args(args).block_size,
            units=args.units,
            seed=args.seed,
        )
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"semblend-dynamo replay: {args.target}: {exc}", file=sys.stderr)
        return 2
    print(report.model_dump_json(indent=2) if args.json else format_target_report(report))
    return 0
