"""A replay run as a SemBench results document (``sembench.result.v2``; fields in docs/sembench.md).

One row per replayed request in SemBench's per-request schema, the run's identity (manifest checksum, engine,
arm), and aggregates computed here over those rows: request and token totals, exact / candidate / eligible /
connector-confirmed reuse, negative controls, route outcomes, overall and per transform. Paired cold/warm
statistics (TTFT, output similarity) need an engine that generates text and are left null.
"""

from __future__ import annotations

import json
import platform
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semblend_dynamo.audit import RUN_ID

from .manifest import manifest_sha256

if TYPE_CHECKING:
    from .report import ReplayReport, RequestReport

__all__ = ["RESULT_VERSION", "request_row", "write_results"]

RESULT_VERSION = "sembench.result.v2"
_ACCEPTED = ("would_materialize", "materialized", "backend_declined")


def _our_version() -> str:
    try:
        return version("semblend-dynamo")
    except PackageNotFoundError:
        return ""


def request_row(r: RequestReport, *, block_size: int, backend_ran: bool) -> dict[str, Any]:
    """One request in SemBench's per-request schema (``RequestMetrics``); unmeasured fields are null."""
    cls = r.replay_class.value
    materialized = r.reused_tokens if cls == "materialized" else 0
    eligible = r.planned_tokens if cls in _ACCEPTED else 0
    declined = cls in ("declined", "backend_declined") and r.reason is not None
    return {
        "item_id": r.request_id,
        "dataset": r.variant,
        "transform": r.transform,
        "negative_control": r.kind.value == "negative_control",
        "donor_count": r.donor_count,
        "prompt_tokens": r.prompt_tokens,
        "total_blocks": -(-r.prompt_tokens // block_size),
        "exact_hit_blocks": r.exact_prefix_tokens // block_size,
        "exact_hit_tokens": r.exact_prefix_tokens,
        "semantic_candidate_blocks": r.planned_tokens // block_size,
        "semantic_candidate_tokens": r.planned_tokens,
        "semantic_eligible_blocks": eligible // block_size,
        "semantic_eligible_tokens": eligible,
        "backend_confirmed_blocks": (r.exact_prefix_tokens + materialized) // block_size if backend_ran else None,
        "backend_confirmed_tokens": r.exact_prefix_tokens + materialized if backend_ran else None,
        "external_confirmed_tokens": materialized if backend_ran else None,
        "external_confirmed_tokens_source": "connector_audit" if backend_ran else None,
        "engine_request_id": r.request_id,
        "audit_joined": True if backend_ran else None,
        "audit_materialized": cls == "materialized" if backend_ran else None,
        "audit_declined_reasons": [r.reason.value] if declined and r.reason is not None else [],
        "semblend_found": r.primary_donor is not None or r.planned_tokens > 0,
        "semblend_similarity": r.similarity or 0.0,
        "semblend_reuse_ratio": materialized / r.prompt_tokens if r.prompt_tokens and backend_ran else 0.0,
        "semblend_latency_ms": r.timings_us.total / 1000.0,
        "donor_ids": [r.primary_donor] if r.primary_donor else [],
        "rejection_reason": r.reason.value if declined and r.reason is not None else None,
        "route_outcome": r.outcome.value,
        "arm": "single",
    }


def _rate(num: float, den: float) -> float:
    return float(num) / float(den) if den else 0.0


def aggregate(rows: list[dict[str, Any]], block_size: int) -> dict[str, Any]:
    """Totals and rates over rows, under SemBench's aggregate field names."""

    def total(key: str, among: list[dict[str, Any]] = rows) -> int:
        return sum(row[key] or 0 for row in among)

    measured = any(row["external_confirmed_tokens"] is not None for row in rows)
    blocks, tokens = total("total_blocks"), total("prompt_tokens")
    negatives = [row for row in rows if row["negative_control"]]
    routes: dict[str, int] = {}
    for row in rows:
        routes[row["route_outcome"]] = routes.get(row["route_outcome"], 0) + 1
    external = total("external_confirmed_tokens") if measured else None
    return {
        "request_count": len(rows),
        "prompt_tokens": tokens,
        "total_blocks": blocks,
        "exact_hit_blocks": total("exact_hit_blocks"),
        "exact_hit_tokens": total("exact_hit_tokens"),
        "semantic_candidate_blocks": total("semantic_candidate_blocks"),
        "semantic_candidate_tokens": total("semantic_candidate_tokens"),
        "semantic_eligible_blocks": total("semantic_eligible_blocks"),
        "semantic_eligible_tokens": total("semantic_eligible_tokens"),
        "backend_confirmed_blocks": total("backend_confirmed_blocks") if measured else None,
        "backend_confirmed_tokens": total("backend_confirmed_tokens") if measured else None,
        "external_confirmed_tokens": external,
        "external_confirmed_token_weighted_reuse_rate": _rate(external, tokens) if external is not None else None,
        "external_confirmed_token_sources": ["connector_audit"] if measured else [],
        "exact_block_hit_rate": _rate(total("exact_hit_blocks"), blocks),
        "semantic_candidate_block_rate": _rate(total("semantic_candidate_blocks"), blocks),
        "semantic_eligible_block_rate": _rate(total("semantic_eligible_blocks"), blocks),
        "backend_confirmed_block_rate": _rate(total("backend_confirmed_blocks"), blocks) if measured else None,
        "exact_token_weighted_reuse_rate": _rate(total("exact_hit_tokens"), tokens),
        "semantic_eligible_token_weighted_reuse_rate": _rate(total("semantic_eligible_tokens"), tokens),
        "negative_control_count": len(negatives),
        "negative_control_blocks": total("total_blocks", negatives),
        "negative_control_semantic_eligible_blocks": total("semantic_eligible_blocks", negatives),
        "negative_control_semantic_placements": sum(r["route_outcome"] == "semantic_placement" for r in negatives),
        "negative_control_backend_confirmed_blocks": (
            sum((r["external_confirmed_tokens"] or 0) // block_size for r in negatives) if measured else None
        ),
        "route_outcomes": dict(sorted(routes.items())),
        "semblend_hit_rate_by_request": _rate(sum(r["semblend_found"] for r in rows), len(rows)),
        "connector_audit_present": measured,
        "connector_audit_rows_joined": sum(bool(r["audit_joined"]) for r in rows) if measured else None,
    }


def write_results(path: str | Path, report: ReplayReport, *, manifest: str | None, backend: str) -> None:
    """Write ``report`` to ``path`` as one SemBench results document."""
    block_size = int(report.config["block_size"])
    backend_ran = backend != "none"
    rows = [request_row(r, block_size=block_size, backend_ran=backend_ran) for r in report.requests]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["transform"], []).append(row)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    document = {
        "result_version": RESULT_VERSION,
        "created_at_utc": now,
        "run": {
            "run_id": RUN_ID,
            "engine": "trtllm",
            "manifest_path": manifest or "",
            "manifest_sha256": manifest_sha256(manifest) if manifest else "",
            "arm": "single",
            "engine_version": "",
            "backend_id": f"semblend-dynamo replay ({'connector harness' if backend_ran else 'plan only'})",
            "baseline_id": "",
            "sembench_version": "",
            "sembench_git_sha": "",
            "sembench_git_dirty": False,
            "semblend_version": _our_version(),
            "timestamp_utc": now,
            "python_version": platform.python_version(),
            "run_host": platform.node(),
        },
        "config": report.config,
        "engine": None,
        "environment": {"python": platform.python_version(), "platform": platform.platform(), "host": platform.node()},
        "aggregate": aggregate(rows, block_size),
        "paired": None,
        "by_transform": {name: aggregate(group, block_size) for name, group in sorted(groups.items())},
        "requests": rows,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, sort_keys=True), encoding="utf-8")
