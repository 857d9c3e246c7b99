"""``semblend-dynamo replay``: a workload through exact check -> discovery -> alignment -> plan.

Runs entirely in-process (no services). The workload is the bundled one or a SemBench manifest (``--manifest``).
Donors are registered first (their KV is taken as resident; a manifest item's donors just before its recipient),
then every target request goes through :func:`replay_request`, which classifies it into one :class:`ReplayClass`.
Prints a table (or one JSON object with ``--json``) and writes the audit JSONL (contract: docs/sembench.md).

The chain ends at the plan unless a :class:`ReplayBackend` is given: a backend (e.g. the TensorRT-LLM connector
harness) receives every donor and every accepted plan and reports what it materialized, which turns
``would_materialize`` into ``materialized`` / ``backend_declined``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from tqdm import tqdm

from semblend_dynamo.audit import AuditEvent, AuditWriter, Role, run_audit_path
from semblend_dynamo.chain import ChainPlan, ChainSettings, plan_chain
from semblend_dynamo.config import ConfigError, SemblendConfig, add_config_arguments, config_from_args
from semblend_dynamo.embedder import Embedder, HashEmbedder, build_embedder
from semblend_dynamo.namespace import ModelIdentity, NamespaceKey
from semblend_dynamo.outcomes import DeclineReason, Outcome
from semblend_dynamo.pipeline import DiscoveryResult, DonorDiscovery
from semblend_dynamo.tokenizer import TokenizerAdapter, TokenizerError

from .backend import DEFAULT_AUDIT_PATH, BackendOutcome, ReplayBackend
from .coverage import DonorCoverage
from .manifest import ManifestError, load_manifest, manifest_sha256, manifest_workload
from .report import ReplayClass, ReplayReport, RequestReport
from .sembench_results import write_results
from .workload import RequestKind, Workload, WorkloadRequest, build_workload

__all__ = [
    "BackendOutcome",
    "ExactPrefixIndex",
    "ReplayBackend",
    "ReplayClass",
    "ReplayReport",
    "RequestReport",
    "add_arguments",
    "replay_request",
    "run",
    "run_replay",
]

_STAGES = ("exact_check", "align", "plan", "embed", "search")


class ExactPrefixIndex:
    """Replay's stand-in for Dynamo's exact KV router: chained block hashes of resident donors, per namespace.

    ``overlap`` is the longest block-aligned prefix of a prompt that some donor of the namespace shares.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[str, set[int]] = {}

    def _chain(self, tokens: Sequence[int]) -> list[int]:
        arr = np.asarray(tokens, dtype=np.int64)
        out: list[int] = []
        parent = 0
        for start in range(0, arr.size - self.block_size + 1, self.block_size):
            parent = xxhash.xxh3_64_intdigest(arr[start : start + self.block_size].tobytes(), seed=parent)
            out.append(parent)
        return out

    def add(self, namespace: str, tokens: Sequence[int]) -> None:
        self._blocks.setdefault(namespace, set()).update(self._chain(tokens))

    def overlap(self, namespace: str, tokens: Sequence[int]) -> int:
        blocks = self._blocks.get(namespace)
        if not blocks:
            return 0
        matched = 0
        for h in self._chain(tokens):
            if h not in blocks:
                break
            matched += 1
        return matched * self.block_size


def replay_request(
    request: WorkloadRequest,
    namespace: NamespaceKey,
    *,
    discovery: DonorDiscovery,
    exact_index: ExactPrefixIndex,
    audit: AuditWriter,
    backend: ReplayBackend | None = None,
    coverage: DonorCoverage | None = None,
) -> RequestReport:
    """One request through exact check -> donor policy -> discovery -> alignment -> plan (-> backend), audited."""
    digest = namespace.digest()
    trace_id = uuid.uuid4().hex[:16]
    t0 = time.perf_counter()
    exact = exact_index.overlap(digest, request.tokens)
    exact_us = (time.perf_counter() - t0) * 1e6
    result = discovery.discover(
        request.request_id, namespace, request.tokens, exact_prefix_tokens=exact, tenancy=request.tenancy
    )
    result.timings_us.exact_check += exact_us
    decision = result.decision
    reason = decision.reason
    plan = decision.plan
    reused = chain_steps = chain_step_tokens = 0
    if result.exact_wins:
        cls, outcome = ReplayClass.EXACT, Outcome.EXACT_PREFIX_ROUTE
    elif discovery.cfg.discovery_only and result.has_evidence:
        cls, outcome = ReplayClass.DISCOVERY_ONLY, Outcome.SEMANTIC_DISCOVERY_ONLY
        reused = plan.reused_tokens if plan is not None else 0
    elif (
        decision.accepted
        and plan is not None
        and (chain := _chain_for(discovery.cfg, request, result, backend)) is None
    ):
        reused = plan.reused_tokens
        cls, outcome = ReplayClass.WOULD_MATERIALIZE, Outcome.SEMANTIC_PLACEMENT
        if backend is not None:
            done = backend.execute(request, namespace, result, trace_id=trace_id)
            reused, reason = done.materialized_tokens, done.reason
            if done.materialized_tokens > 0:
                cls, outcome = ReplayClass.MATERIALIZED, Outcome.BACKEND_MATERIALIZED
            else:
                cls, outcome = ReplayClass.BACKEND_DECLINED, Outcome.BACKEND_DECLINED
    elif (chain := _chain_for(discovery.cfg, request, result, backend)) is not None and backend is not None:
        done = backend.execute_chain(request, namespace, chain, trace_id=trace_id)
        reused, reason = done.materialized_tokens, done.reason
        chain_steps, chain_step_tokens = done.chain_steps, done.chain_step_tokens
        if done.materialized_tokens > 0:
            cls, outcome = ReplayClass.MATERIALIZED, Outcome.BACKEND_MATERIALIZED
        else:
            cls, outcome = ReplayClass.BACKEND_DECLINED, Outcome.BACKEND_DECLINED
    elif result.spans or reason not in (DeclineReason.NO_CANDIDATE, None):
        cls, outcome = ReplayClass.DECLINED, Outcome.COLD_FALLBACK
    elif result.primary_donor is not None:
        cls, outcome = ReplayClass.PLACEMENT, Outcome.SEMANTIC_PLACEMENT
    else:
        cls, outcome = ReplayClass.COLD, Outcome.COLD_FALLBACK

    # The router's record (replay stands in for the router): `routed`, or `declined` when it ends the request. The
    # connector writes the request's `lookup`; one per request keeps a parser's semantic-hit count honest.
    routed: dict[str, Any] = {
        "role": Role.RECIPIENT,
        "trace_id": trace_id,
        "request_id": request.request_id,
        "namespace": digest,
        "component": "replay",
        "outcome": outcome,
        "donor_id": result.primary_donor,
        "similarity": result.best_similarity,
        "mode": discovery.cfg.mode,
        "latency_us": result.timings_us.total,
    }
    if cls is ReplayClass.EXACT:
        routed["tokens"] = exact
    elif plan is not None and cls in (ReplayClass.WOULD_MATERIALIZE, ReplayClass.DISCOVERY_ONLY):
        shifts = [s.delta for s in plan.spans if s.delta]
        routed.update(
            tokens=plan.reused_tokens,
            blocks=plan.reused_tokens // discovery.cfg.block_size,
            requires_rope_correction=plan.requires_rope_correction,
            delta=shifts[0] if shifts else 0,
            detail=f"plan mode={plan.mode} spans={len(plan.spans)} deviation={plan.estimated_deviation:.3f}",
        )
    if cls in (ReplayClass.DECLINED, ReplayClass.COLD) and reason is not None:
        audit.write(event=AuditEvent.DECLINED, rejection_reason=reason, detail=decision.detail or None, **routed)
    else:
        audit.write(event=AuditEvent.ROUTED, **routed)

    return RequestReport(
        request_id=request.request_id,
        trace_id=trace_id,
        kind=request.kind,
        variant=request.variant,
        transform=request.transform_name,
        replay_class=cls,
        outcome=outcome,
        reason=reason,
        prompt_tokens=result.prompt_tokens,
        exact_prefix_tokens=exact,
        reused_tokens=reused,
        planned_tokens=plan.reused_tokens if plan is not None else 0,
        donor_count=len(request.seed_donors or request.related_donors),
        donor_covered_tokens=coverage.covered(digest, request.tokens) if coverage is not None else 0,
        chain_steps=chain_steps,
        chain_step_tokens=chain_step_tokens,
        similarity=result.best_similarity,
        primary_donor=result.primary_donor,
        primary_is_related=result.primary_donor in request.related_donors,
        timings_us=result.timings_us,
    )


def load_embedder(cfg: SemblendConfig, notices: list[str]) -> Embedder:
    """The configured embedder; MiniLM that cannot load falls back to the hash embedder with a notice."""
    if cfg.embedder == "hash":
        return HashEmbedder()
    try:
        embedder = build_embedder(cfg)
    except Exception as exc:  # any MiniLM start-up failure: replay must still run
        notices.append(f"MiniLM embedder unavailable ({type(exc).__name__}: {exc}); using the hash embedder")
        return HashEmbedder()
    if isinstance(embedder, HashEmbedder):
        notices.append(
            "MiniLM embedder not installed (pip install 'semblend-dynamo[embedder]'); using the hash embedder"
        )
    return embedder


def run_replay(
    cfg: SemblendConfig,
    *,
    units: int = 4,
    seed: int = 0,
    backend: ReplayBackend | None = None,
    progress: bool = False,
    embedder: Embedder | None = None,
    manifest: str | None = None,
) -> ReplayReport:
    """Build the workload (bundled, or ``manifest``'s), register its donors and replay every request.

    Raises ConfigError on unusable settings and ManifestError on an unreadable manifest.
    """
    notices: list[str] = []
    try:
        tokenizer = TokenizerAdapter.from_config(cfg.tokenizer)
    except TokenizerError as exc:
        raise ConfigError(f"SEMBLEND_TOKENIZER={cfg.tokenizer!r}: {exc}") from None
    if manifest is not None:
        workload = manifest_workload(load_manifest(manifest), tokenizer, block_size=cfg.block_size)
    else:
        try:
            workload = build_workload(tokenizer, block_size=cfg.block_size, units=units, seed=seed)
        except ValueError as exc:
            raise ConfigError(f"SEMBLEND_BLOCK_SIZE={cfg.block_size!r}: {exc}") from None
    emb = embedder if embedder is not None else load_embedder(cfg, notices)
    discovery = DonorDiscovery.from_config(cfg, embedder=emb, tokenizer=tokenizer, background=False)
    exact_index = ExactPrefixIndex(cfg.block_size)
    identity = backend.identity if backend is not None else ModelIdentity.from_config(cfg)
    coverage = DonorCoverage(cfg.min_span_tokens)
    audit_path = run_audit_path(cfg.audit_path or DEFAULT_AUDIT_PATH, append=cfg.audit_append)
    reports: list[RequestReport] = []
    donors = {d.donor_id: d for d in workload.donors}
    seeded = {d for r in workload.requests for d in r.seed_donors}
    registration_s = 0.0
    with AuditWriter(audit_path) as audit:

        def register(donor_ids: list[str]) -> None:
            nonlocal registration_s
            t0 = time.perf_counter()
            for donor_id in donor_ids:
                donor = donors.pop(donor_id, None)
                if donor is None:  # registered already (donors may be shared by items)
                    continue
                namespace = identity.namespace(tenant=donor.tenant)
                discovery.register_donor(donor.donor_id, namespace, donor.tokens)
                exact_index.add(namespace.digest(), donor.tokens)
                coverage.add(namespace.digest(), donor.tokens)
                trace_id = uuid.uuid4().hex[:16]
                if backend is not None:  # the connector writes the donor's record when it pins it
                    backend.register_donor(donor, namespace, trace_id=trace_id)
                else:
                    audit.write(
                        event=AuditEvent.DONOR_REGISTERED,
                        role=Role.DONOR_PREFILL,
                        trace_id=trace_id,
                        donor_id=donor.donor_id,
                        namespace=namespace.digest(),
                        component="replay",
                        tokens=len(donor.tokens),
                    )
            registration_s += time.perf_counter() - t0

        register([d.donor_id for d in _bar(workload.donors, "donors", progress) if d.donor_id not in seeded])
        for request in _bar(workload.requests, "requests", progress):
            register(request.seed_donors)
            namespace = identity.namespace(tenant=request.tenant)
            reports.append(
                replay_request(
                    request,
                    namespace,
                    discovery=discovery,
                    exact_index=exact_index,
                    audit=audit,
                    backend=backend,
                    coverage=coverage,
                )
            )
    discovery.close()
    report = _summarize(cfg, workload, emb, reports, registration_s, discovery, str(audit_path), notices)
    if manifest is not None:
        report.workload.update(manifest=str(manifest), manifest_sha256=manifest_sha256(manifest))
    return report


def _bar(items: list[Any], what: str, enabled: bool) -> Any:
    # disable=None: tqdm shows the bar only on a terminal
    disable = None if enabled and len(items) >= 20 else True
    return tqdm(items, desc=what, unit=what[:-1], file=sys.stderr, disable=disable, leave=False)


def expected_classes(cfg: SemblendConfig, backend: bool) -> list[ReplayClass]:
    """The classes the bundled workload is built to produce under ``cfg``."""
    out = [ReplayClass.EXACT, ReplayClass.DECLINED, ReplayClass.COLD]
    if cfg.discovery_only:
        out.append(ReplayClass.DISCOVERY_ONLY)
    else:
        out.append(ReplayClass.PLACEMENT)
        out.append(ReplayClass.MATERIALIZED if backend else ReplayClass.WOULD_MATERIALIZE)
    return out


LOADING = (ReplayClass.WOULD_MATERIALIZE, ReplayClass.MATERIALIZED)


CHAIN_REASONS = (DeclineReason.NOT_PREFIX_CONTIGUOUS, DeclineReason.BELOW_REUSE_RATIO)
"""Plan declines a prefill chain can overcome: spans behind the recipient's own words, or too little of them at once."""


def _chain_for(
    cfg: SemblendConfig, request: WorkloadRequest, result: DiscoveryResult, backend: ReplayBackend | None
) -> ChainPlan | None:
    """A prefill chain for a request the plain plan declined or covers less of, or None (chains off, no gain)."""
    if backend is None or not cfg.chain_enabled or cfg.mode != "shifted" or not result.spans:
        return None
    decision = result.decision
    if decision.reason not in CHAIN_REASONS and not decision.accepted:
        return None
    chain = plan_chain(len(request.tokens), result.spans, ChainSettings.from_config(cfg))
    if not chain.accepted or chain.plan is None:
        return None
    if decision.accepted and decision.plan is not None and chain.plan.loaded_tokens <= decision.plan.reused_tokens:
        return None  # the plain load already takes as much: no steps needed
    return chain.plan


def by_transform(reports: list[RequestReport]) -> dict[str, dict[str, Any]]:
    """The report's ``by_transform``: per transform name, what its requests came to.

    ``materialized`` counts loads the backend confirmed (or, without a backend, plans that would load);
    ``declined`` maps reasons to requests (gate and backend declines); ``false_positives`` (negative controls
    only) counts those that loaded donor KV.
    """
    out: dict[str, dict[str, Any]] = {}
    for r in reports:
        row = out.setdefault(
            r.transform,
            {
                "requests": 0,
                "exact": 0,
                "placement": 0,
                "materialized": 0,
                "declined": {},
                "cold": 0,
                "materialized_tokens": 0,
                "chain_steps": 0,
                "chain_step_tokens": 0,
                "served_tokens": 0,
                "donor_covered_tokens": 0,
                "prompt_tokens": 0,
            },
        )
        row["requests"] += 1
        row["prompt_tokens"] += r.prompt_tokens
        row["donor_covered_tokens"] += r.donor_covered_tokens
        row["chain_steps"] += r.chain_steps
        row["chain_step_tokens"] += r.chain_step_tokens
        row["served_tokens"] += served_tokens(r)
        cls = r.replay_class
        if cls in LOADING:
            row["materialized"] += 1
            row["materialized_tokens"] += r.reused_tokens
        elif cls in (ReplayClass.DECLINED, ReplayClass.BACKEND_DECLINED):
            reason = r.reason.value if r.reason is not None else "unspecified"
            row["declined"][reason] = row["declined"].get(reason, 0) + 1
        elif cls in (ReplayClass.EXACT, ReplayClass.PLACEMENT, ReplayClass.COLD):
            row[cls.value] += 1
        else:  # discovery_only: evidence reported, nothing placed or loaded
            row[cls.value] = row.get(cls.value, 0) + 1
        if r.kind is RequestKind.NEGATIVE_CONTROL:
            row["false_positives"] = row.get("false_positives", 0) + int(cls in LOADING)
    return dict(sorted(out.items()))


def served_tokens(r: RequestReport) -> int:
    """Prompt tokens served from donor KV: the engine's own prefix hit when exact wins, else the connector's loads."""
    if r.replay_class is ReplayClass.EXACT:
        return r.exact_prefix_tokens
    return (r.reused_tokens if r.replay_class in LOADING else 0) + r.chain_step_tokens


def reach(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Donor-covered tokens served from donor KV across the reuse transforms (every one but the negative control)."""
    names = [n for n in rows if n != RequestKind.NEGATIVE_CONTROL.value]
    served = sum(rows[n]["served_tokens"] for n in names)
    covered = sum(rows[n]["donor_covered_tokens"] for n in names)
    negative = rows.get(RequestKind.NEGATIVE_CONTROL.value, {})
    return {
        "transforms": names,
        "served_tokens": served,
        "donor_covered_tokens": covered,
        "share": round(served / covered, 4) if covered else 0.0,
        "negative_control_false_positives": negative.get("false_positives", 0),
    }


def _summarize(
    cfg: SemblendConfig,
    workload: Workload,
    embedder: Embedder,
    reports: list[RequestReport],
    registration_s: float,
    discovery: DonorDiscovery,
    audit_path: str,
    notices: list[str],
) -> ReplayReport:
    outcomes = Counter(r.replay_class.value for r in reports)
    declined = Counter(
        r.reason.value
        for r in reports
        if r.reason is not None and r.replay_class in (ReplayClass.DECLINED, ReplayClass.BACKEND_DECLINED)
    )
    by_kind: dict[str, dict[str, int]] = {}
    for r in reports:
        row = by_kind.setdefault(r.kind.value, {})
        row[r.replay_class.value] = row.get(r.replay_class.value, 0) + 1
    negatives = [r for r in reports if r.kind is RequestKind.NEGATIVE_CONTROL]
    latency: dict[str, dict[str, float | int]] = {}
    for stage in (*_STAGES, "total"):
        values = [getattr(r.timings_us, stage) for r in reports]
        ran = np.array([v for v in values if v > 0.0])
        if ran.size:
            latency[stage] = {
                "p50": round(float(np.percentile(ran, 50)), 1),
                "p99": round(float(np.percentile(ran, 99)), 1),
                "n": int(ran.size),
            }
    # a manifest promises no outcome classes: only the bundled workload is built to produce each one
    expected = (
        expected_classes(cfg, backend=any(r.replay_class is ReplayClass.MATERIALIZED for r in reports))
        if not any(r.seed_donors for r in workload.requests)
        else []
    )
    return ReplayReport(
        config={
            "mode": cfg.mode,
            "embedder": getattr(embedder, "name", type(embedder).__name__),
            "block_size": cfg.block_size,
            "min_span_tokens": cfg.min_span_tokens,
            "min_similarity": cfg.min_similarity,
            "min_reuse_ratio": cfg.min_reuse_ratio,
            "strict_prefix_boundary": cfg.strict_prefix_boundary,
            "exact_route_threshold": cfg.exact_route_threshold,
            "max_embed_windows": cfg.max_embed_windows,
            "isolation": cfg.isolation,
        },
        workload={
            "seed": workload.seed,
            "donors": len(workload.donors),
            "requests": len(workload.requests),
            "kinds": [k.value for k in workload.kinds()],
        },
        outcomes={c.value: outcomes.get(c.value, 0) for c in ReplayClass},
        declined_by_reason=dict(sorted(declined.items())),
        by_kind=by_kind,
        expected_classes=[c.value for c in expected],
        missing_classes=[c.value for c in expected if outcomes.get(c.value, 0) == 0],
        prompt_tokens=sum(r.prompt_tokens for r in reports),
        reused_tokens=sum(r.reused_tokens for r in reports if r.replay_class in LOADING),
        by_transform=(transforms := by_transform(reports)),
        reach=reach(transforms) if any(r.seed_donors for r in workload.requests) else {},
        negative_controls={
            "requests": len(negatives),
            "materializations": sum(r.replay_class in LOADING for r in negatives),
            "placements": sum(r.replay_class is ReplayClass.PLACEMENT for r in negatives),
        },
        latency_us=latency,
        donor_registration_s=round(registration_s, 3),
        counters=dict(sorted(discovery.counters.items())),
        audit_path=audit_path,
        notices=notices,
        requests=reports,
    )


# --- CLI --------------------------------------------------------------------------------------------
SETTINGS = ("modes", "model", "embedding", "donor index", "planner gates", "prefill chain", "connector", "audit")
"""The setting groups replay reads (it runs no NATS or Dynamo)."""

EXAMPLES = """examples:
  semblend-dynamo replay                                   # the bundled workload through the connector harness
  semblend-dynamo replay --embedder hash --backend none    # no ONNX Runtime, stop at the plan
  semblend-dynamo replay --exact-materialization-only 0 --isolation cache_salt   # shifted spans
  semblend-dynamo replay --json --requests --audit-path /tmp/audit.jsonl
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    parser.add_argument("--units", type=int, default=4, help="requests per workload kind (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--requests", action="store_true", help="also list every request (table or JSON)")
    parser.add_argument(
        "--manifest",
        metavar="FILE",
        help="replay a SemBench replay manifest (JSONL, sembench.manifest.v1) instead of the bundled workload",
    )
    parser.add_argument(
        "--sembench-results",
        metavar="PATH",
        help="also write the run as a SemBench results document (sembench.result.v2) to PATH",
    )
    parser.add_argument(
        "--backend",
        choices=("connector", "none"),
        default="connector",
        help="connector: continue through the TensorRT-LLM connector in its PyExecutor harness (backend outcomes); "
        "none: stop at the plan ('would materialize')",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if an expected outcome class is missing or a negative control would materialize",
    )
    target = parser.add_argument_group("through a running endpoint (e.g. one `semblend-dynamo up` started)")
    target.add_argument("--target", default=None, help="OpenAI base URL: send the workload there instead of in-process")
    target.add_argument("--router-metrics", default=None, help="the router's metrics URL: its outcome counters")
    target.add_argument("--model", default=None, help="model name at the target (default: the first it lists)")
    add_config_arguments(parser, SETTINGS)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.units < 1:
        raise ConfigError(f"--units={args.units}: must be >= 1")
    if args.target:
        from .http_target import main_target

        return main_target(args)
    backend = _connector_backend(cfg) if args.backend == "connector" else None
    try:
        report = run_replay(
            cfg, units=args.units, seed=args.seed, progress=not args.json, backend=backend, manifest=args.manifest
        )
    except ManifestError as exc:
        print(f"semblend-dynamo replay: {exc}", file=sys.stderr)
        return 2
    finally:
        if backend is not None:
            backend.close()
    if args.sembench_results:
        write_results(args.sembench_results, report, manifest=args.manifest, backend=args.backend)
    for notice in report.notices:
        print(f"semblend-dynamo replay: notice: {notice}", file=sys.stderr)
    if args.json:
        data = report.model_dump(mode="json")
        if args.requests:
            data["requests"] = [r.model_dump(mode="json") for r in report.requests]
        print(json.dumps(data, indent=2))
    else:
        print(format_report(report, with_requests=args.requests))
    if args.check and (report.missing_classes or report.negative_controls["materializations"]):
        return 1
    return 0


def _connector_backend(cfg: SemblendConfig) -> Any:
    """The TensorRT-LLM connector backend (trtllm_connector), or None with a notice when torch is missing."""
    try:
        from .connector_backend import ConnectorReplayBackend
    except ImportError as exc:
        print(
            f"semblend-dynamo replay: notice: connector backend unavailable ({exc}); stopping at the plan",
            file=sys.stderr,
        )
        return None
    return ConnectorReplayBackend(cfg)


def format_report(report: ReplayReport, *, with_requests: bool = False) -> str:
    """The human-readable replay table."""
    cfg, wl = report.config, report.workload
    lines = [
        f"semblend-dynamo replay: {wl['requests']} requests, {wl['donors']} donors (seed {wl['seed']}), "
        f"mode={cfg['mode']}, embedder={cfg['embedder']}, block_size={cfg['block_size']}",
        "",
        f"{'outcome':<20}{'requests':>9}",
    ]
    lines += [f"{name:<20}{count:>9}" for name, count in report.outcomes.items() if count]
    if report.declined_by_reason:
        lines += ["", "declined by reason:"]
        lines += [f"  {name:<30}{count:>5}" for name, count in report.declined_by_reason.items()]
    classes = [c for c, n in report.outcomes.items() if n]
    lines += ["", "by workload kind:", f"  {'kind':<24}" + "".join(f"{c[:12]:>13}" for c in classes)]
    for kind, row in report.by_kind.items():
        lines.append(f"  {kind:<24}" + "".join(f"{row.get(c, 0):>13}" for c in classes))
    if "manifest" in wl:
        lines += [
            "",
            f"by transform ({wl['manifest']}):",
            f"  {'transform':<27}{'requests':>9}{'exact':>7}{'placed':>7}{'mat.':>6}{'declined':>9}{'cold':>6}"
            f"{'mat. tokens':>12}{'steps':>6}{'served':>8}{'covered':>9}{'false +':>8}",
        ]
        for name, t in report.by_transform.items():
            lines.append(
                f"  {name:<27}{t['requests']:>9}{t['exact']:>7}{t['placement']:>7}{t['materialized']:>6}"
                f"{sum(t['declined'].values()):>9}{t['cold']:>6}{t['materialized_tokens']:>12}{t['chain_steps']:>6}"
                f"{t['served_tokens']:>8}{t['donor_covered_tokens']:>9}{t.get('false_positives', ''):>8}"
            )
        if report.reach:
            lines.append(
                f"  reach: {report.reach['served_tokens']} of {report.reach['donor_covered_tokens']} donor-covered "
                f"tokens served from donor KV ({report.reach['share']:.1%}; exact prefix hits, loads, chain-step loads)"
            )
    share = report.reused_tokens / report.prompt_tokens if report.prompt_tokens else 0.0
    backend_ran = bool(report.outcomes.get("materialized") or report.outcomes.get("backend_declined"))
    neg = report.negative_controls
    lines += [
        "",
        f"tokens {'materialized by the connector' if backend_ran else 'that would be reused'}: "
        f"{report.reused_tokens} of {report.prompt_tokens} prompt tokens ({share:.1%})",
        f"negative controls: {neg['requests']} requests, {neg['materializations']} false-positive materializations, "
        f"{neg['placements']} similarity placements",
        "",
        f"{'stage latency (us)':<20}{'p50':>10}{'p99':>10}{'n':>6}",
    ]
    lines += [
        f"{stage:<20}{v['p50']:>10.1f}{v['p99']:>10.1f}{int(v['n']):>6}" for stage, v in report.latency_us.items()
    ]
    lines += [
        f"donor registration: {report.donor_registration_s:.2f} s (embedding off the request path)",
        f"audit: {Path(report.audit_path)}",
    ]
    if report.missing_classes:
        lines.append(f"missing expected classes: {', '.join(report.missing_classes)}")
    if with_requests:
        lines += ["", f"{'request':<34}{'class':<19}{'reason':<28}{'reused':>7}"]
        for r in report.requests:
            lines.append(
                f"{r.request_id:<34}{r.replay_class.value:<19}{(r.reason.value if r.reason else ''):<28}"
                f"{r.reused_tokens:>7}"
            )
    return "\n".join(lines)
