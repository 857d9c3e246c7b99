"""The outcome vocabulary shared by every component (docs/architecture.md).

One outcome per request, recorded by the component that knows it. Reuse ROI is counted only for
``backend_materialized``. Every decline carries a :class:`DeclineReason`.
"""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    """What happened to one request."""

    EXACT_PREFIX_ROUTE = "exact_prefix_route"
    SEMANTIC_DISCOVERY_ONLY = "semantic_discovery_only"
    SEMANTIC_PLACEMENT = "semantic_placement"
    BACKEND_MATERIALIZED = "backend_materialized"
    BACKEND_DECLINED = "backend_declined"
    COLD_FALLBACK = "cold_fallback"


class DeclineReason(str, Enum):
    """Why donor KV was not (or will not be) used. A decline is never an error for the request."""

    NO_CANDIDATE = "no_candidate"
    BELOW_SIMILARITY = "below_similarity"
    BELOW_MIN_SPAN = "below_min_span"
    BELOW_REUSE_RATIO = "below_reuse_ratio"
    TOO_MANY_SPANS = "too_many_spans"
    DEVIATION_TOO_HIGH = "deviation_too_high"
    NAMESPACE_MISMATCH = "namespace_mismatch"
    DONOR_EVICTED = "donor_evicted"
    DONOR_NOT_RESIDENT = "donor_not_resident"
    DONOR_LEASE_EXPIRED = "donor_lease_expired"
    GENERATION_MISMATCH = "generation_mismatch"
    UNSUPPORTED_ROPE = "unsupported_rope"
    UNSUPPORTED_LAYOUT = "unsupported_layout"
    DISCOVERY_ONLY = "discovery_only"
    EXACT_ONLY_MODE = "exact_only_mode"
    ISOLATION_REQUIRED = "isolation_required"
    ALIGNMENT_NOT_BLOCK_ALIGNED = "alignment_not_block_aligned"
    NOT_PREFIX_CONTIGUOUS = "not_prefix_contiguous"
    CHAIN_DOES_NOT_PAY = "chain_does_not_pay"
    CHAIN_STEP_FAILED = "chain_step_failed"
    EXACT_PREFIX_WINS = "exact_prefix_wins"
    PROMPT_TOO_SHORT = "prompt_too_short"
    EMPTY_PROMPT = "empty_prompt"
    INVALID_EMBEDDING = "invalid_embedding"
    SEMANTIC_DISABLED = "semantic_disabled"
    CAPACITY = "capacity"
    EMBEDDING_OVERLOADED = "embedding_overloaded"
    """The router's embedding queue was full or the prompt's embedding missed its budget: routed exact-only."""
    TENANT_UNKNOWN = "tenant_unknown"
    APPROXIMATE_LINEAGE = "approximate_lineage"
    BLOCK_HASH_MISMATCH = "block_hash_mismatch"
    LAYER_GROUPS_UNSUPPORTED = "layer_groups_unsupported"
    KV_SCALE_UNKNOWN = "kv_scale_unknown"
    LOAD_CANCELLED = "load_cancelled"
    INTERNAL_ERROR = "internal_error"
