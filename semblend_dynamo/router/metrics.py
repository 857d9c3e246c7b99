"""Prometheus metrics of the router (own registry, so several routers can live in one process)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..events.codec import REJECT_REASONS
from ..outcomes import Outcome
from .prefill_chain import STEP_RESULTS

_LATENCY_BUCKETS_S = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
STREAMS = ("kv_events", "kv_index", "donors", "outcomes", "donors_sync", "sync_pages")
SYNC_REJECT_REASONS = ("no_reply", "bad_reply_subject", "rate_limited")
"""Why a decoded sync request got no reply (besides the codec's reasons)."""
SYNC_PAGE_REJECT_REASONS = ("unsolicited",)
"""Why a decoded sync page was not used: it answers no request in flight."""
FETCH_OUTCOMES = (
    "loaded",
    "none",
    "gone",
    "too_large",
    "abandoned",
    "unwritable",
    "digest_mismatch",
    "unreadable",
    "bad_snapshot",
    "incompatible",
    "not_empty",
    "over_capacity",
    "error",
    "closed",
)
"""How a replica's fetch of a peer's search index ended."""
SERVE_OUTCOMES = ("saved", "empty", "unknown", "failed", "disabled")
"""Snapshot requests answered other than with a part of the snapshot held."""
SPANS_DURING_EXACT_RESULTS = ("used", "wasted", "failed")
_LAG_BUCKETS_S = (1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RouterMetrics:
    """Every metric the router exports, prefixed ``semblend_router_``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter("semblend_router_decisions", "routing decisions by outcome", ["outcome"], registry=r)
        self.declines = Counter(
            "semblend_router_semantic_declines", "semantic stage declines by reason", ["reason"], registry=r
        )
        self.stage_latency = Histogram(
            "semblend_router_stage_seconds",
            "router stage latency (parse, ask_loads, exact, spans, semantic, load, decide, chain_steps, hint, "
            "forward_first_response, total_added)",
            ["stage"],
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.events_in = Counter("semblend_router_events_in", "messages accepted per stream", ["stream"], registry=r)
        self.kv_blocks_in = Counter("semblend_router_kv_block_events", "kv-event blocks applied", registry=r)
        self.kv_ingest_lag = Histogram(
            "semblend_router_kv_ingest_lag_seconds",
            "kv-events message applied minus its publisher's published_at (nats event plane)",
            buckets=_LAG_BUCKETS_S,
            registry=r,
        )
        self.events_rejected = Counter(
            "semblend_router_events_rejected",
            "messages rejected per stream and reason",
            ["stream", "reason"],
            registry=r,
        )
        self.events_out = Counter("semblend_router_events_out", "messages published per kind", ["kind"], registry=r)
        self.events_dropped = Counter(
            "semblend_router_events_dropped",
            "messages not published, per kind and reason",
            ["kind", "reason"],
            registry=r,
        )
        self.outcomes_reported = Counter(
            "semblend_router_backend_outcomes", "outcomes reported by connectors", ["outcome"], registry=r
        )
        # block-weighted: what the semantic stage claimed per worker vs what that worker's backend confirmed
        self.hinted_blocks = Counter(
            "semblend_router_hinted_blocks",
            "whole blocks of donor spans hinted, per worker and decision (semantic evidence)",
            ["worker_id", "decision"],
            registry=r,
        )
        self.confirmed_blocks = Counter(
            "semblend_router_backend_confirmed_blocks",
            "whole blocks a worker's connector reported materialized from donors (backend-confirmed reuse)",
            ["worker_id"],
            registry=r,
        )
        self.donors = Gauge(
            "semblend_router_donors", "donors in the index per worker", ["worker_id", "dp_rank", "state"], registry=r
        )
        self.donors_total = Gauge("semblend_router_donors_total", "donors in the index", registry=r)
        self.donors_dropped = Counter(
            "semblend_router_donors_dropped",
            "donor changes not made, by kind (registration: a finished prompt; local, peer, remove: a change for the "
            "discovery pipeline's indexer) and reason (queue_full, closed)",
            ["kind", "reason"],
            registry=r,
        )
        self.indexer_backlog = Gauge(
            "semblend_router_indexer_backlog", "donor changes queued for the discovery pipeline's indexer", registry=r
        )
        self.maps_rewrite_left = Gauge(
            "semblend_router_block_maps_rewrite_left",
            "block-map entries that base rewrites in progress have still to write (the loop settles them)",
            registry=r,
        )
        self.indexer_held = Gauge(
            "semblend_router_indexer_held",
            "1 while a donor sync holds the indexer (its backlog waits until the catalog has the peers' donors)",
            registry=r,
        )
        self.nats_connected = Gauge("semblend_router_nats_connected", "1 while NATS is connected", registry=r)
        self.embeddings = Counter(
            "semblend_router_prompt_embeddings",
            "prompt embeddings asked for by requests, by result (ok, error, budget, queue_full)",
            ["result"],
            registry=r,
        )
        for result in ("ok", "error", "budget", "queue_full"):
            self.embeddings.labels(result)
        self.sync_replies = Counter(
            "semblend_router_sync_replies", "donor sync pages sent (one per valid request at most)", registry=r
        )
        self.sync_peers = Counter(
            "semblend_router_sync_peers",
            "peers this replica synced its donors from, by result (done, abandoned: quiet after every retry)",
            ["result"],
            registry=r,
        )
        for result in ("done", "abandoned"):
            self.sync_peers.labels(result)
        self.index_snapshots = Counter(
            "semblend_router_index_snapshots",
            "search indexes sent whole between replicas, by side and outcome (fetched: loaded, none, gone, too_large, "
            "abandoned, unwritable, digest_mismatch, unreadable, bad_snapshot, incompatible, not_empty, over_capacity, error, "
            "closed; served: saved, empty, unknown, failed, disabled)",
            ["side", "outcome"],
            registry=r,
        )
        for outcome in FETCH_OUTCOMES:
            self.index_snapshots.labels("fetched", outcome)
        for outcome in SERVE_OUTCOMES:
            self.index_snapshots.labels("served", outcome)
        self.forward_retries = Counter(
            "semblend_router_forward_retries", "placements retried without restriction", ["reason"], registry=r
        )
        self.chain_steps = Counter(
            "semblend_router_chain_steps",
            "prefill-chain steps sent, by result (ok, timeout, error, wrong_worker: the chain then runs cold)",
            ["result"],
            registry=r,
        )
        for result in STEP_RESULTS:
            self.chain_steps.labels(result)
        self.spans_during_exact = Counter(
            "semblend_router_spans_during_exact",
            "span searches run while Dynamo's exact query was in flight, by result (used; wasted: exact reuse won; "
            "failed: the search raised, searched again after the exact answer)",
            ["result"],
            registry=r,
        )
        self.spans_during_exact_of = {r: self.spans_during_exact.labels(r) for r in SPANS_DURING_EXACT_RESULTS}
        """Each result's child, looked up once: counted on every span-path request, where ``labels()`` costs twice the
        ``inc()``."""
        self._events_out_of: dict[str, Any] = {}
        for outcome in Outcome:
            self.decisions.labels(outcome.value)
        for stream in STREAMS:
            self.events_in.labels(stream)
            for reason in (*REJECT_REASONS, "handler_error"):
                self.events_rejected.labels(stream, reason)
        for reason in SYNC_REJECT_REASONS:
            self.events_rejected.labels("donors_sync", reason)
        for reason in SYNC_PAGE_REJECT_REASONS:
            self.events_rejected.labels("sync_pages", reason)

    def event_out(self, kind: str) -> None:
        """One message of ``kind`` published (``events_out``; each kind's child looked up once: a hint is counted before
        its request is forwarded)."""
        child = self._events_out_of.get(kind)
        if child is None:
            child = self._events_out_of[kind] = self.events_out.labels(kind)
        child.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
