"""Versioned SemBlend event models (docs/architecture.md) and Dynamo's own KV-event shapes.

Every SemBlend message is a pydantic model whose wire key ``schema`` names kind and version
(``semblend.<kind>/v<N>``). Models are text-free: prompts travel as hashes, embeddings as float16
bytes. :mod:`semblend_dynamo.events.codec` puts them in a Dynamo-style msgpack envelope.

The ``Kv*`` models are the typed form of Dynamo 1.6's ``kv-events`` payload
(``RouterEvent`` of Dynamo 1.6's KV-event plane). They are only ever decoded, never published.
"""

from __future__ import annotations

import array
import itertools
import operator
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Protocol, TypeVar

import numpy as np
import xxhash
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..audit import Role
from ..namespace import NamespaceKey
from ..outcomes import DeclineReason, Outcome
from ..vector_codes import to_f16

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
    """The ``<kind>`` of ``semblend.<kind>/v<VERSION>``; also the envelope topic suffix."""
    VERSION: ClassVar[int] = 1


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


_HINT_FIELDS_GIVEN = (
    "request_key",
    "request_id",
    "donor_id",
    "donor_key",
    "worker_id",
    "dp_rank",
    "namespace",
    "similarity",
    "spans",
    "decision",
    "trace_id",
)


def _plain(text: object, shortest: int, longest: int) -> bool:
    """``text`` is a str (not a subclass) of ASCII characters (no surrogate, which validation refuses), of a length
    within the bounds."""
    return type(text) is str and text.isascii() and shortest <= len(text) <= longest


def recipient_hint(
    *,
    request_key: str,
    request_id: str | None,
    donor_id: str,
    donor_key: str | None,
    worker_id: int,
    dp_rank: int,
    namespace: str,
    similarity: float | None,
    spans: list[tuple[int, int, int]],
    decision: Outcome,
    trace_id: str | None,
) -> DonorHint:
    """``DonorHint(...)`` of these fields (a recipient's hint, the router's), the same hint, without running pydantic's
    validation when every field is already what it would store: of its exact type and within the schema's bounds.
    Any other value goes through the validation, which converts it or raises as it always does. The router makes a
    hint per placed request: the validation was about half of that step's ~50 µs cache-cold (session 18,
    branch gate18)."""
    if not (
        _plain(request_key, 1, 64)
        and (request_id is None or _plain(request_id, 0, 256))
        and _plain(donor_id, 1, 256)
        and (donor_key is None or _plain(donor_key, 1, 64))
        and type(worker_id) is int
        and 0 <= worker_id < 1 << 64
        and type(dp_rank) is int
        and 0 <= dp_rank < 1 << 32
        and _plain(namespace, 1, 64)
        and (similarity is None or (type(similarity) is float and -1.0 <= similarity <= 1.0))
        and type(spans) is list
        and len(spans) <= 4096
        and all(
            type(span) is tuple
            and len(span) == 3
            and type(span[0]) is int
            and type(span[1]) is int
            and type(span[2]) is int
            and span[0] >= 0
            and span[1] >= 0
            and span[2] > 0
            for span in spans
        )
        and type(decision) is Outcome
        and (trace_id is None or _plain(trace_id, 1, 64))
    ):
        return DonorHint(
            request_key=request_key,
            request_id=request_id,
            donor_id=donor_id,
            donor_key=donor_key,
            worker_id=worker_id,
            dp_rank=dp_rank,
            namespace=namespace,
            similarity=similarity,
            spans=spans,
            decision=decision,
            trace_id=trace_id,
        )
    hint = DonorHint.__new__(DonorHint)
    # the fields in the model's order (the codec writes __dict__'s values in it), as validation stores them: the
    # enum's value (use_enum_values), the defaults as they are (not validated)
    object.__setattr__(
        hint,
        "__dict__",
        {
            "schema_": "semblend.hint/v1",
            "request_key": request_key,
            "request_id": request_id,
            "donor_id": donor_id,
            "donor_key": donor_key,
            "worker_id": worker_id,
            "dp_rank": dp_rank,
            "namespace": namespace,
            "similarity": similarity,
            "spans": spans,
            "decision": decision.value,
            "issued_at": time.time(),
            "trace_id": trace_id,
            "role": Role.RECIPIENT,
            "chain_head_tokens": None,
        },
    )
    object.__setattr__(hint, "__pydantic_fields_set__", set(_HINT_FIELDS_GIVEN))
    object.__setattr__(hint, "__pydantic_extra__", None)
    object.__setattr__(hint, "__pydantic_private__", None)
    return hint


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

    @property
    def embedding_codes(self) -> bool:
        """A registration's embedding is float16 (a catalog entry's may be int8 codes: :class:`RegistrationFields`)."""
        return False


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
"""Donors per sync page at most (the page's bytes are bounded by the message limit)."""
SYNC_PAGE_OVERHEAD = 1024
"""Bytes of a sync page besides its donors' own bytes (envelope, keys, column headers), an upper bound."""
SYNC_ROW_FIXED_BYTES = 2 + 2 + 8 + 4 + 8 + 2 + 8 + 4 + 2 + 1 + 4 * 3
"""Per donor: the fixed-width columns plus the headers of its four strings (worst case 3 bytes each)."""


class RegistrationFields(Protocol):
    """What a sync page carries of a registration: a :class:`DonorRegistration` or the catalog's compact entry."""

    @property
    def donor_id(self) -> str: ...
    @property
    def donor_key(self) -> str | None: ...
    @property
    def router_id(self) -> str: ...
    @property
    def worker_id(self) -> int: ...
    @property
    def dp_rank(self) -> int: ...
    @property
    def namespace(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def block_hashes(self) -> Sequence[int]: ...
    @property
    def embedding(self) -> bytes:
        """float16 values, or int8 codes when ``embedding_codes`` (:mod:`semblend_dynamo.vector_codes`)."""
        ...

    @property
    def embedding_codes(self) -> bool: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def registered_at(self) -> float: ...


def sync_page_bytes(registration: RegistrationFields) -> int:
    """An upper bound of the bytes one donor adds to a :class:`DonorSyncPage` (its strings counted in full)."""
    r = registration
    strings = len(r.donor_id) + len(r.donor_key or "") + len(r.router_id) + len(r.namespace)
    if not (r.donor_id.isascii() and (r.donor_key or "").isascii() and r.router_id.isascii()):
        strings = sum(len(s.encode()) for s in (r.donor_id, r.donor_key or "", r.router_id, r.namespace))
    # 2 bytes a dimension (1 for codes): a registration's embedding is validated to that length, and a catalog entry's
    # is read from its blob only by copying it (build_page checks the encoded page's real size in any case)
    return SYNC_ROW_FIXED_BYTES + strings + 8 * len(r.block_hashes) + (1 if r.embedding_codes else 2) * r.embedding_dim


class DonorSyncRequest(SemblendEvent):
    """A router asks a peer for the registrations in a range of its catalog cursors (``...donors.sync``).

    The reply goes to the requester's own sync inbox (``_INBOX.semblend.<router_id>``, checked by the responder).
    ``target`` None asks every peer for its first page (``after`` 0, ``upto`` None); follow-ups name one peer and a
    cursor range ``(after, upto]`` of that peer's (``upto`` None: to the end).
    """

    KIND: ClassVar[str] = "sync"
    VERSION: ClassVar[int] = 2
    schema_: Literal["semblend.sync/v2"] = Field("semblend.sync/v2", alias="schema")
    router_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    deployment: Digest
    target: str | None = Field(None, max_length=64)
    after: U64 = 0
    upto: U64 | None = None

    @model_validator(mode="after")
    def _range(self) -> DonorSyncRequest:
        if self.upto is not None and self.upto <= self.after:
            raise ValueError("upto must be above after")
        return self


_U8, _U16, _U32, _F64, _B = np.dtype("<u8"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<f8"), np.dtype("u1")
_SYNC_COLUMNS: dict[str, np.dtype] = {
    "router_index": _U16,
    "namespace_index": _U16,
    "worker_ids": _U8,
    "dp_ranks": _U32,
    "num_tokens": _U8,
    "block_sizes": _U16,
    "registered_at": _F64,
    "block_counts": _U32,
    "embedding_dims": _U16,
    "embedding_codes": _B,
}
"""The fixed-width per-donor columns of a sync page and their little-endian types."""


class DonorSyncPage(SemblendEvent):
    """The one reply to one :class:`DonorSyncRequest`: the peer's registrations in the range, as columns.

    One row per donor: ``donor_ids`` and ``donor_keys`` as strings, ``router_ids`` and ``namespaces`` as
    dictionaries indexed by ``router_index`` / ``namespace_index`` (u16), fixed-width little-endian columns
    (worker id u64, DP rank u32, tokens u64, block size u16, registration time f64, block count u32, embedding dim
    u16, embedding form u8: 1 for int8 codes, 0 for float16), then every donor's Dynamo block hashes as one u64 array
    and every embedding in one ``bytes`` (each donor's run as long as its count / dim, 1 or 2 bytes a dimension by its
    form; the catalog sends each as it keeps it, :mod:`semblend_dynamo.vector_codes`). Every registration is checked as :class:`DonorRegistration` checks it,
    column by column. ``after``/``upto`` echo the request; ``next_cursor`` (None: the range is done) is where the
    requester continues; ``last_cursor`` is the peer's newest cursor when it answered.
    """

    KIND: ClassVar[str] = "syncpage"
    VERSION: ClassVar[int] = 3
    schema_: Literal["semblend.syncpage/v3"] = Field("semblend.syncpage/v3", alias="schema")
    router_id: Identifier
    deployment: Digest
    after: U64 = 0
    upto: U64 | None = None
    next_cursor: U64 | None = None
    last_cursor: U64 = 0
    donor_ids: list[Identifier] = Field(default_factory=list, max_length=MAX_SYNC_PAGE)
    donor_keys: list[Digest | None] = Field(default_factory=list, max_length=MAX_SYNC_PAGE)
    router_ids: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=MAX_SYNC_PAGE)
    namespaces: list[Digest] = Field(default_factory=list, max_length=MAX_SYNC_PAGE)
    router_index: bytes = b""
    namespace_index: bytes = b""
    worker_ids: bytes = b""
    dp_ranks: bytes = b""
    num_tokens: bytes = b""
    block_sizes: bytes = b""
    registered_at: bytes = b""
    block_counts: bytes = b""
    block_hashes: bytes = b""
    embedding_dims: bytes = b""
    embedding_codes: bytes = b""
    embeddings: bytes = b""

    @model_validator(mode="after")
    def _check_columns(self) -> DonorSyncPage:
        n = len(self.donor_ids)
        if len(self.donor_keys) != n:
            raise ValueError("donor_keys and donor_ids differ in length")
        if len(set(self.donor_ids)) != n:
            raise ValueError("a donor appears twice in one page")
        for name, dtype in _SYNC_COLUMNS.items():
            if len(getattr(self, name)) != n * dtype.itemsize:
                raise ValueError(f"{name} is not {n} values of {dtype.itemsize} bytes")
        c = self.columns()
        if n and (
            int(c["router_index"].max()) >= len(self.router_ids)
            or int(c["namespace_index"].max()) >= len(self.namespaces)
        ):
            raise ValueError("a dictionary index is out of range")
        if n and (int(c["block_sizes"].min()) < 1 or int(c["block_sizes"].max()) > 1024):
            raise ValueError("block_sizes outside [1, 1024]")
        if n and int(c["block_counts"].max()) > MAX_BLOCK_HASHES:
            raise ValueError("a donor has too many block hashes")
        if n and int(c["embedding_dims"].max()) > MAX_EMBEDDING_DIM:
            raise ValueError("an embedding is too long")
        if not np.isfinite(c["registered_at"]).all():
            raise ValueError("registered_at is not finite")
        if len(self.block_hashes) != 8 * int(c["block_counts"].sum(dtype=np.uint64)):
            raise ValueError("block_hashes does not hold the block counts' hashes")
        if n and int(c["embedding_codes"].max()) > 1:
            raise ValueError("an embedding form is neither float16 (0) nor int8 codes (1)")
        if len(self.embeddings) != int(_embedding_bytes(c).sum(dtype=np.uint64)):
            raise ValueError("embeddings does not hold the embedding dims' values")
        needed = c["block_counts"].astype(np.uint64) * c["block_sizes"].astype(np.uint64)
        if (c["num_tokens"] < needed).any():
            raise ValueError("num_tokens is smaller than the blocks it claims")
        return self

    def columns(self) -> dict[str, np.ndarray]:
        """The fixed-width columns as arrays (views of the page's bytes)."""
        return {name: np.frombuffer(getattr(self, name), dtype=dtype) for name, dtype in _SYNC_COLUMNS.items()}

    def __len__(self) -> int:
        return len(self.donor_ids)

    def rows(self) -> SyncRows:
        """The page's rows as columns of Python values (already checked by the page's validation)."""
        c = self.columns()
        counts, sizes = c["block_counts"], _embedding_bytes(c)
        hash_ends = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        embedding_ends = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        alike = len(counts) and (counts == counts[0]).all() and (sizes == sizes[0]).all()
        hashes = array.array("Q")
        hashes.frombytes(np.frombuffer(self.block_hashes, dtype=_U8).astype(np.uint64, copy=False).tobytes())
        return SyncRows(
            deployment=self.deployment,
            donor_ids=self.donor_ids,
            donor_keys=self.donor_keys,
            router_ids=[self.router_ids[i] for i in c["router_index"].tolist()],
            namespaces=[self.namespaces[i] for i in c["namespace_index"].tolist()],
            worker_ids=c["worker_ids"].tolist(),
            dp_ranks=c["dp_ranks"].tolist(),
            num_tokens=c["num_tokens"].tolist(),
            block_sizes=c["block_sizes"].tolist(),
            registered_at=c["registered_at"].tolist(),
            embedding_dims=c["embedding_dims"].tolist(),
            embedding_codes=c["embedding_codes"].astype(bool).tolist(),
            hash_starts=hash_ends[:-1].tolist(),
            hash_ends=hash_ends[1:].tolist(),
            embedding_starts=embedding_ends[:-1].tolist(),
            embedding_ends=embedding_ends[1:].tolist(),
            block_hashes=hashes,
            embeddings=self.embeddings,
            row_sizes=(int(counts[0]), int(sizes[0])) if alike else None,
        )

    def registrations(self) -> list[DonorRegistration]:
        """One :class:`DonorRegistration` per row (already checked by the page's validation: built without it; int8
        codes as their unit vector in float16)."""
        rows = self.rows()
        hashes = rows.block_hashes.tolist()
        out: list[DonorRegistration] = []
        for i, donor_id in enumerate(rows.donor_ids):
            h0, e0 = rows.hash_starts[i], rows.embedding_starts[i]
            out.append(
                _trusted_registration(
                    {
                        "schema_": "semblend.donor/v1",
                        "donor_id": donor_id,
                        "donor_key": rows.donor_keys[i],
                        "router_id": rows.router_ids[i],
                        "worker_id": rows.worker_ids[i],
                        "dp_rank": rows.dp_ranks[i],
                        "deployment": rows.deployment,
                        "namespace": rows.namespaces[i],
                        "num_tokens": rows.num_tokens[i],
                        "block_size": rows.block_sizes[i],
                        "block_hashes": hashes[h0 : rows.hash_ends[i]],
                        "embedding": to_f16(rows.embeddings[e0 : rows.embedding_ends[i]], rows.embedding_codes[i]),
                        "embedding_dim": rows.embedding_dims[i],
                        "registered_at": rows.registered_at[i],
                    }
                )
            )
        return out

    @classmethod
    def of(
        cls,
        rows: Sequence[RegistrationFields] | SyncColumns,
        *,
        router_id: str,
        deployment: str,
        after: int,
        upto: int | None,
        next_cursor: int | None,
        last_cursor: int,
    ) -> DonorSyncPage:
        """The page of ``rows``: registrations, or rows already in the page's columns (all of ``deployment``, each
        valid already), in order.

        Built without validation: the receiver validates every page it decodes.
        """
        columns = rows if isinstance(rows, SyncColumns) else SyncColumns.of(rows)
        return cls.model_construct(
            router_id=router_id,
            deployment=deployment,
            after=after,
            upto=upto,
            next_cursor=next_cursor,
            last_cursor=last_cursor,
            **{name: getattr(columns, name) for name in SyncColumns.__slots__},
        )


@dataclass(frozen=True, slots=True)
class SyncColumns:
    """The rows of a sync page in the page's own columns (:class:`DonorSyncPage` says what each holds): what a
    replica serving a sync builds, from registrations (:meth:`of`) or straight from its catalog's entries."""

    donor_ids: list[str]
    donor_keys: list[str | None]
    router_ids: list[str]
    namespaces: list[str]
    router_index: bytes
    namespace_index: bytes
    worker_ids: bytes
    dp_ranks: bytes
    num_tokens: bytes
    block_sizes: bytes
    registered_at: bytes
    block_counts: bytes
    block_hashes: bytes
    embedding_dims: bytes
    embedding_codes: bytes
    embeddings: bytes

    @classmethod
    def of(cls, registrations: Sequence[RegistrationFields]) -> SyncColumns:
        """The columns of ``registrations``, in order."""
        regs = registrations
        routers, router_index = dictionary_index([r.router_id for r in regs])
        namespaces, namespace_index = dictionary_index([r.namespace for r in regs])
        return cls(
            donor_ids=[r.donor_id for r in regs],
            donor_keys=[r.donor_key for r in regs],
            router_ids=routers,
            namespaces=namespaces,
            router_index=router_index,
            namespace_index=namespace_index,
            worker_ids=_column([r.worker_id for r in regs], _U8),
            dp_ranks=_column([r.dp_rank for r in regs], _U32),
            num_tokens=_column([r.num_tokens for r in regs], _U8),
            block_sizes=_column([r.block_size for r in regs], _U16),
            registered_at=_column([r.registered_at for r in regs], _F64),
            block_counts=_column([len(r.block_hashes) for r in regs], _U32),
            block_hashes=np.fromiter(itertools.chain.from_iterable(r.block_hashes for r in regs), dtype=_U8).tobytes(),
            embedding_dims=_column([r.embedding_dim for r in regs], _U16),
            embedding_codes=_column([r.embedding_codes for r in regs], _B),
            embeddings=b"".join(r.embedding for r in regs),
        )


def dictionary_index(values: list[str]) -> tuple[list[str], bytes]:
    """A column of strings as a sync page sends it: the distinct values in first-seen order, and each row's index
    into them (u16)."""
    seen: dict[str, int] = {}
    index = [seen.setdefault(value, len(seen)) for value in values]
    return list(seen), _column(index, _U16)


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class SyncRows:
    """A sync page's registrations as columns (:meth:`DonorSyncPage.rows`): row ``i`` of every list is donor ``i``.

    ``block_hashes`` holds every donor's hashes (native u64), donor ``i``'s from ``hash_starts[i]`` to
    ``hash_ends[i]``; ``embeddings`` every embedding, donor ``i``'s from byte ``embedding_starts[i]`` to
    ``embedding_ends[i]``, as int8 codes if ``embedding_codes[i]``, else float16.
    """

    deployment: str
    donor_ids: list[str]
    donor_keys: list[str | None]
    router_ids: list[str]
    namespaces: list[str]
    worker_ids: list[int]
    dp_ranks: list[int]
    num_tokens: list[int]
    block_sizes: list[int]
    registered_at: list[float]
    embedding_dims: list[int]
    embedding_codes: list[bool]
    hash_starts: list[int]
    hash_ends: list[int]
    embedding_starts: list[int]
    embedding_ends: list[int]
    block_hashes: array.array[int]
    embeddings: bytes
    row_sizes: tuple[int, int] | None = None
    """Every row's block hash count and embedding bytes when all rows have as many (so row ``i``'s lie at ``i`` times
    those), else None."""

    def __len__(self) -> int:
        return len(self.donor_ids)

    @staticmethod
    def pick(column: list[_T], picked: Sequence[int]) -> list[_T]:
        """The values of rows ``picked`` (a range of step 1: a slice) of one of the columns."""
        if isinstance(picked, range) and picked.step == 1:
            return column[picked.start : picked.stop]
        if len(picked) == 1:
            return [column[picked[0]]]
        return list(operator.itemgetter(*picked)(column)) if picked else []

    @staticmethod
    def picker(picked: Sequence[int]) -> RowPicker:
        """:meth:`pick` of rows ``picked`` for column after column (the getter made once)."""
        return RowPicker(picked)


class RowPicker:
    """:meth:`SyncRows.pick` of the same rows of several columns: ``picker(column)``."""

    __slots__ = ("_getter", "_rows")

    def __init__(self, picked: Sequence[int]) -> None:
        self._rows: slice | None = None
        self._getter: Callable[[list[Any]], tuple[Any, ...]] | None = None
        if isinstance(picked, range) and picked.step == 1:
            self._rows = slice(picked.start, picked.stop)
        elif len(picked) == 1:
            self._rows = slice(picked[0], picked[0] + 1)
        elif not picked:
            self._rows = slice(0, 0)
        else:
            self._getter = operator.itemgetter(*picked)

    def __call__(self, column: list[_T]) -> list[_T]:
        if self._rows is not None:
            return column[self._rows]
        assert self._getter is not None
        return list(self._getter(column))


def _embedding_bytes(columns: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's embedding bytes: 2 a dimension for float16, 1 for int8 codes."""
    return columns["embedding_dims"].astype(np.int64) * (2 - columns["embedding_codes"].astype(np.int64))


def _column(values: list[int] | list[float] | list[bool], dtype: np.dtype) -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


_REGISTRATION_FIELDS = frozenset(DonorRegistration.model_fields)


def _trusted_registration(fields: dict[str, object]) -> DonorRegistration:
    """A registration from fields that were checked already (what ``model_construct`` does, ~10x faster)."""
    registration = DonorRegistration.__new__(DonorRegistration)
    object.__setattr__(registration, "__dict__", fields)
    object.__setattr__(registration, "__pydantic_fields_set__", _REGISTRATION_FIELDS)
    object.__setattr__(registration, "__pydantic_extra__", None)
    object.__setattr__(registration, "__pydantic_private__", None)
    return registration


class IndexSnapshotRequest(SemblendEvent):
    """A late replica asks one peer for its search index saved whole (``...donors.sync``, reply to the requester's
    sync inbox as for :class:`DonorSyncRequest`).

    ``snapshot`` None asks the peer to save one (or name the one it holds) and send its first part; then each
    request names the snapshot (its digest) and one ``part``.
    """

    KIND: ClassVar[str] = "indexsnap"
    VERSION: ClassVar[int] = 1
    schema_: Literal["semblend.indexsnap/v1"] = Field("semblend.indexsnap/v1", alias="schema")
    router_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    deployment: Digest
    target: Annotated[str, Field(min_length=1, max_length=64)]
    snapshot: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] | None = None
    part: NonNeg = 0


class IndexSnapshotPart(SemblendEvent):
    """One part of a saved search index: bytes ``[part * part_bytes, ...)`` of a file of ``size`` bytes whose
    xxh3-128 is ``snapshot``; ``parts`` in all. ``parts`` 0 (and no data) says the peer has none to send."""

    KIND: ClassVar[str] = "indexpart"
    VERSION: ClassVar[int] = 1
    schema_: Literal["semblend.indexpart/v1"] = Field("semblend.indexpart/v1", alias="schema")
    router_id: Identifier
    deployment: Digest
    snapshot: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] | None = None
    part: NonNeg = 0
    parts: NonNeg = 0
    part_bytes: Annotated[int, Field(ge=1024)] = 1024
    size: NonNeg = 0
    data: bytes = b""

    @model_validator(mode="after")
    def _extent(self) -> IndexSnapshotPart:
        if self.parts == 0:
            if self.data or self.snapshot is not None:
                raise ValueError("a part of no snapshot carries nothing")
            return self
        if self.snapshot is None or self.parts != -(-self.size // self.part_bytes) or self.part >= self.parts:
            raise ValueError("part, parts, part_bytes and size disagree")
        if len(self.data) != min(self.part_bytes, self.size - self.part * self.part_bytes):
            raise ValueError("data is not the part's bytes")
        return self


EVENT_MODELS: tuple[type[SemblendEvent], ...] = (
    DonorHint,
    RouteEvidence,
    DonorRegistration,
    DonorLifecycle,
    OutcomeReport,
    DonorSyncRequest,
    DonorSyncPage,
    IndexSnapshotRequest,
    IndexSnapshotPart,
)
MODEL_BY_SCHEMA: dict[str, type[SemblendEvent]] = {f"semblend.{m.KIND}/v{m.VERSION}": m for m in EVENT_MODELS}
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
