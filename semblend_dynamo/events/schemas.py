"""Versioned SemBlend event models (docs/architecture.md) and Dynamo's own KV-event shapes.

Every SemBlend message is a pydantic model whose wire key ``schema`` names kind and version
(``semblend.<kind>/v1``). Models are text-free: prompts travel as hashes, embeddings as float16
bytes. :mod:`semblend_dynamo.events.codec` puts them in a Dynamo-style msgpack envelope.

The ``Kv*`` models are the typed form of Dynamo 1.6's ``kv-events`` payload
(``RouterEvent`` of Dynamo 1.6's KV-event plane). They are only ever decoded, never published.
"""

from __future__ import annotations

import array
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
import xxhash
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..audit import Role
from ..namespace import NamespaceKey
from ..outcomes import DeclineReason, Outcome

U64 = Annotated[int, Field(ge=0, lt=1 << 64)]
U32 = Annotated[int, Field(ge=0, lt=1 << 32)]
NonNeg = Annotated[int, Field(ge=0)]
Digest = Annotated[str, Field(min_length=1, max_length=64)]
Identifier = Annotated[str, Field(min_length=1, max_length=256)]
SpanTriple = tuple[NonNeg, NonNeg, Annotated[int, Field(gt=0)]]
"""``(donor_start, target_start, length)`` in tokens."""

assert array.array("I").itemsize == 4, "request_key needs a 4-byte unsigned int array type"

MAX_EMBEDDING_DIM = 4096
MAX_BLOCK_HASHES = 1 << 17


def u32_tokens(tokens: Sequence[int]) -> array.array[int]:
    """Token ids as a native u32 array (raises OverflowError / TypeError for ids outside ``[0, 2**32)``).

    A list goes through ``array.fromlist``, which reads its items without taking references: about a third faster
    than ``array("I", list)`` (``benchmarks/bench_token_unboxing.py``; the connector does this once per decision).
    """
    if not isinstance(tokens, list):
        return array.array("I", tokens)
    buf = array.array("I")
    buf.fromlist(tokens)
    return buf


def request_key(tokens: Sequence[int]) -> str:
    """The key that ties a hint to a request: hex xxh3_64 of the prompt's little-endian u32 token bytes.

    Router and connector both compute it from the full prompt token ids alone. Raises ValueError for
    token ids outside ``[0, 2**32)``.
    """
    if isinstance(tokens, array.array) and tokens.typecode == "I" and sys.byteorder == "little":
        return xxhash.xxh3_64_hexdigest(tokens)  # already the wire form (the connector converts the prompt once)
    try:
        buf = u32_tokens(tokens)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
    if sys.byteorder == "big":  # pragma: no cover - the wire form is little-endian
        buf.byteswap()
    return xxhash.xxh3_64_hexdigest(buf)


def deployment_digest(key: NamespaceKey) -> str:
    """Digest of a namespace with tenant and adapter removed: what every message of one deployment shares.

    Decoders use it to reject messages from another model/tokenizer/layout without the tenant's salt
    ever travelling on the wire.
    """
    return key.model_copy(update={"cache_salt": "", "lora": ""}).digest()


class SemblendEvent(BaseModel):
    """Base of every SemBlend message: strict fields, immutable, enum values on the wire."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        use_enum_values=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )
    KIND: ClassVar[str]
    """The ``<kind>`` of ``semblend.<kind>/v1``; also the envelope topic suffix."""


class DonorHint(SemblendEvent):
    """What the router tells the chosen worker about a donor, on that worker's NATS hints subject.

    Advisory: the connector re-validates everything (namespace, residency, spans) before promising tokens.
    """

    KIND: ClassVar[str] = "hint"
    schema_: Literal["semblend.hint/v1"] = Field("semblend.hint/v1", alias="schema")
    request_key: Digest
    request_id: str | None = Field(None, max_length=256)
    donor_id: Identifier
    donor_key: Digest | None = None
    """``request_key`` of the donor's prompt, so a worker can find the donor from its own tokens."""
    worker_id: U64
    dp_rank: U32 = 0
    namespace: Digest
    similarity: float | None = Field(None, ge=-1.0, le=1.0)
    spans: list[SpanTriple] = Field(default_factory=list, max_length=4096)
    decision: Outcome
    issued_at: float = Field(default_factory=time.time)
    trace_id: str | None = Field(None, min_length=1, max_length=64)
    """The router's id for this request: the connector stamps it on its audit records, so the two sides join."""
    role: Role = Role.RECIPIENT
    """``donor_prefill``: the request only makes a donor (a replay or benchmark seeding donors); it loads nothing.
    ``chain_step``: a prefill-only step of a prefill chain (its loads are not a client's reuse)."""
    chain_head_tokens: NonNeg | None = None
    """Set on every request of a prefill chain: the chain was weighed as a whole (semblend_dynamo/chain.py) and each
    span's first ``chain_head_tokens`` tokens are recomputed in the new context."""


class RouteEvidence(SemblendEvent):
    """One routing decision, published after the router forwarded the request."""

    KIND: ClassVar[str] = "evidence"
    schema_: Literal["semblend.evidence/v1"] = Field("semblend.evidence/v1", alias="schema")
    request_id: Identifier
    request_key: Digest
    router_id: str = Field("", max_length=256)
    deployment: Digest
    namespace: Digest
    outcome: Outcome
    decline_reason: DeclineReason | None = None
    worker_id: U64 | None = None
    dp_rank: U32 = 0
    prompt_tokens: NonNeg
    exact_overlap_blocks: NonNeg = 0
    hint: DonorHint | None = None
    trace_id: str | None = Field(None, max_length=64)
    stage_latency_us: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    ts: float = Field(default_factory=time.time)


class DonorRegistration(SemblendEvent):
    """A finished request became a donor on a worker. Replicas index it from this message alone.

    ``block_hashes`` are Dynamo's per-block ``tokens_hash`` (LocalBlockHash, seeded with LoRA and cache
    salt as ``compute_block_hash_for_seq`` does), so residency can be followed through ``kv-events``.
    """

    KIND: ClassVar[str] = "donor"
    schema_: Literal["semblend.donor/v1"] = Field("semblend.donor/v1", alias="schema")
    donor_id: Identifier
    donor_key: Digest | None = None
    router_id: str = Field("", max_length=256)
    worker_id: U64
    dp_rank: U32 = 0
    deployment: Digest
    namespace: Digest
    num_tokens: NonNeg
    block_size: Annotated[int, Field(ge=1, le=1024)]
    block_hashes: list[U64] = Field(max_length=MAX_BLOCK_HASHES)
    embedding: bytes = Field(max_length=2 * MAX_EMBEDDING_DIM)
    embedding_dim: Annotated[int, Field(ge=0, le=MAX_EMBEDDING_DIM)]
    registered_at: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _check_embedding(self) -> DonorRegistration:
        if len(self.embedding) != 2 * self.embedding_dim:
            raise ValueError(
                f"embedding has {len(self.embedding)} bytes, expected 2*embedding_dim={2 * self.embedding_dim}"
            )
        if self.num_tokens < len(self.block_hashes) * self.block_size:
            raise ValueError("num_tokens is smaller than the blocks it claims")
        return self

    @classmethod
    def pack_embedding(cls, vector: np.ndarray) -> tuple[bytes, int]:
        """float16 little-endian bytes and dimension for a 1-D embedding."""
        flat = np.asarray(vector, dtype="<f2").reshape(-1)
        return flat.tobytes(), int(flat.shape[0])

    def vector(self) -> np.ndarray:
        """The embedding as float32 (empty when the registration carries none)."""
        return np.frombuffer(self.embedding, dtype="<f2").astype(np.float32)


class DonorLifecycle(SemblendEvent):
    """A connector pinned, released or evicted a donor's blocks on a worker."""

    KIND: ClassVar[str] = "lifecycle"
    schema_: Literal["semblend.lifecycle/v1"] = Field("semblend.lifecycle/v1", alias="schema")
    donor_id: Identifier
    worker_id: U64
    dp_rank: U32 = 0
    deployment: Digest
    namespace: Digest
    event: Literal["pinned", "released", "evicted"]
    generation: NonNeg = 0
    ts: float = Field(default_factory=time.time)


class OutcomeReport(SemblendEvent):
    """What the backend did with a request (connector -> routers)."""

    KIND: ClassVar[str] = "outcome"
    schema_: Literal["semblend.outcome/v1"] = Field("semblend.outcome/v1", alias="schema")
    request_id: Identifier
    request_key: Digest
    worker_id: U64
    dp_rank: U32 = 0
    deployment: Digest
    namespace: Digest
    outcome: Outcome
    materialized_tokens: NonNeg = 0
    rejection_reason: DeclineReason | None = None
    donor_id: str | None = Field(None, max_length=256)
    ts: float = Field(default_factory=time.time)


MAX_SYNC_PAGE = 4096


class DonorSyncRequest(SemblendEvent):
    """A router asks its peers for their donor registrations, one page per request (``...donors.sync``).

    The reply goes to the requester's own sync inbox (``_INBOX.semblend.<router_id>``, checked by the responder).
    ``target`` None asks every peer for its first page; a follow-up names the peer whose ``next_cursor`` it sends.
    """

    KIND: ClassVar[str] = "sync"
    schema_: Literal["semblend.sync/v1"] = Field("semblend.sync/v1", alias="schema")
    router_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    deployment: Digest
    target: str | None = Field(None, max_length=64)
    cursor: NonNeg = 0


class DonorSyncPage(SemblendEvent):
    """One page of a peer's donor catalog, the one reply to one :class:`DonorSyncRequest`."""

    KIND: ClassVar[str] = "syncpage"
    schema_: Literal["semblend.syncpage/v1"] = Field("semblend.syncpage/v1", alias="schema")
    router_id: Identifier
    deployment: Digest
    registrations: list[DonorRegistration] = Field(max_length=MAX_SYNC_PAGE)
    next_cursor: NonNeg | None = None

    @model_validator(mode="after")
    def _one_deployment(self) -> DonorSyncPage:
        if any(r.deployment != self.deployment for r in self.registrations):
            raise ValueError("a sync page carries registrations of another deployment")
        return self


EVENT_MODELS: tuple[type[SemblendEvent], ...] = (
    DonorHint,
    RouteEvidence,
    DonorRegistration,
    DonorLifecycle,
    OutcomeReport,
    DonorSyncRequest,
    DonorSyncPage,
)
MODEL_BY_SCHEMA: dict[str, type[SemblendEvent]] = {f"semblend.{m.KIND}/v1": m for m in EVENT_MODELS}
KIND_BY_PREFIX: dict[str, type[SemblendEvent]] = {f"semblend.{m.KIND}/": m for m in EVENT_MODELS}


# --- Dynamo's kv-events (decoded only) ----------------------------------------------------------
# Plain slotted dataclasses rather than pydantic models: these are decoded views of Dynamo's own wire
# format on the router's hottest path (hundreds of thousands of blocks per second), where pydantic
# construction cost more than the decoding. codec.decode_kv_events range-checks every field.


@dataclass(frozen=True, slots=True)
class KvStored:
    """Blocks stored on a worker: engine ids (``block_hashes``) with Dynamo content hashes (``tokens_hashes``)."""

    block_hashes: list[int]
    tokens_hashes: list[int]
    parent_hash: int | None = None


@dataclass(frozen=True, slots=True)
class KvRemoved:
    """Blocks (engine ids) removed from a worker."""

    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class KvCleared:
    """Every block of the emitting ``(worker_id, dp_rank)`` is gone."""


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One Dynamo ``RouterEvent``."""

    worker_id: int
    event_id: int
    data: KvStored | KvRemoved | KvCleared
    dp_rank: int = 0
    storage_tier: str = "device"

    @property
    def num_blocks(self) -> int:
        return 0 if isinstance(self.data, KvCleared) else len(self.data.block_hashes)


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    """One ``kv-events`` NATS message: the envelope header plus its RouterEvents."""

    publisher_id: int
    sequence: int
    published_at: int
    events: list[KvEvent]
