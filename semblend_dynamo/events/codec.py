"""MessagePack codec for SemBlend events and the decoder of Dynamo's ``kv-events``.

Wire form (mimics Dynamo 1.6's event plane): a msgpack map
``{publisher_id, sequence, published_at, topic, payload}`` (only ``topic`` and ``payload`` are required; extra
keys such as ``published_at_ns`` are ignored) whose ``payload`` is the msgpack map of one
model (wire key ``schema`` = ``semblend.<kind>/v1``). Every decoder raises :class:`RejectedMessage`
with a short ``reason`` (counted by the caller) for anything malformed, truncated, oversized,
wrong-version or from another deployment; it never raises anything else.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, TypeVar, overload

import msgpack
from pydantic import ValidationError

from .schemas import (
    KIND_BY_PREFIX,
    MODEL_BY_SCHEMA,
    DonorHint,
    KvCleared,
    KvEvent,
    KvEventBatch,
    KvRemoved,
    KvStored,
    SemblendEvent,
)
from .subjects import KV_EVENTS_TOPIC, TOPIC_BY_KIND

M = TypeVar("M", bound=SemblendEvent)

ENVELOPE_KEYS = frozenset({"topic", "payload"})
"""The envelope keys a decoder needs; any other key (``published_at_ns`` ...) is accepted and ignored."""
ENVELOPE_HEADER_KEYS = ("publisher_id", "sequence", "published_at")
"""Optional u64 header fields (0 when absent, range-checked when present)."""

REJECT_REASONS = (
    "oversized",
    "truncated",
    "malformed",
    "bad_envelope",
    "wrong_topic",
    "unknown_schema",
    "wrong_version",
    "unexpected_schema",
    "invalid_fields",
    "wrong_namespace",
)
"""Every ``RejectedMessage.reason`` (metrics pre-create a counter per reason)."""

_U64 = 1 << 64
_CLEARED = KvCleared()


class RejectedMessage(Exception):
    """A message that was not accepted; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def topic_of(model: type[SemblendEvent] | SemblendEvent) -> str:
    """Envelope topic (and subject suffix) of a model."""
    return TOPIC_BY_KIND[model.KIND]


_PACKERS = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's packer: ``msgpack.packb(..., use_bin_type=True)`` without a new packer per call (``pack`` resets
    it after each object; one per thread, as a packer is not meant to be shared)."""
    try:
        packer: msgpack.Packer = _PACKERS.packer
    except AttributeError:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    return packer


_WIRE_KEYS: dict[type[SemblendEvent], tuple[str, ...]] = {
    DonorHint: tuple(field.alias or name for name, field in DonorHint.model_fields.items())
}
"""Models whose payload :func:`encode` packs from their fields' values directly: the hint, written on the request
path. Its fields hold wire values already (enum values, tuples; no nested model, no custom serializer), so
``model_dump(mode="python", by_alias=True)`` is the same map with the wire keys, in the same order, and packs to the
same bytes (pinned by ``tests/router/test_events.py``)."""


def encode(
    model: SemblendEvent, *, publisher_id: int = 0, sequence: int = 0, published_at_ms: int | None = None
) -> bytes:
    """One enveloped message for ``model``."""
    packer = _packer()
    keys = _WIRE_KEYS.get(type(model))
    fields = (
        dict(zip(keys, model.__dict__.values(), strict=True))
        if keys is not None
        else model.model_dump(mode="python", by_alias=True)
    )
    envelope = {
        "publisher_id": publisher_id % _U64,
        "sequence": sequence % _U64,
        "published_at": int(time.time() * 1000) if published_at_ms is None else published_at_ms,
        "topic": topic_of(model),
        "payload": packer.pack(fields),
    }
    return packer.pack(envelope)


def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except msgpack.ExtraData:
        raise RejectedMessage("malformed", f"{what}: trailing bytes") from None
    except ValueError as exc:
        if "incomplete" in str(exc):
            raise RejectedMessage("truncated", what) from None
        raise RejectedMessage("malformed", f"{what}: {exc}") from None
    except Exception as exc:  # msgpack raises assorted types (TypeError, UnicodeDecodeError, ...) on garbage
        raise RejectedMessage("malformed", f"{what}: {type(exc).__name__}") from None


def _open_envelope(data: bytes, max_bytes: int) -> tuple[dict[str, Any], bytes]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RejectedMessage("malformed", "not bytes")
    if len(data) > max_bytes:
        raise RejectedMessage("oversized", f"{len(data)} > {max_bytes} bytes")
    env = _unpack(bytes(data), "envelope")
    if not isinstance(env, dict) or not env.keys() >= ENVELOPE_KEYS:
        raise RejectedMessage("bad_envelope", "expected a map with topic and payload")
    payload = env["payload"]
    for key in ENVELOPE_HEADER_KEYS:
        value = env.setdefault(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _U64:
            raise RejectedMessage("bad_envelope", f"{key} is not a u64")
    if not isinstance(env["topic"], str) or not isinstance(payload, bytes):
        raise RejectedMessage("bad_envelope", "topic must be a string and payload bytes")
    return env, payload


@overload
def decode(data: bytes, expected: type[M], *, max_bytes: int, deployment: str | None = None) -> M: ...
@overload
def decode(
    data: bytes, expected: tuple[type[SemblendEvent], ...], *, max_bytes: int, deployment: str | None = None
) -> SemblendEvent: ...
def decode(
    data: bytes,
    expected: type[SemblendEvent] | tuple[type[SemblendEvent], ...],
    *,
    max_bytes: int,
    deployment: str | None = None,
) -> SemblendEvent:
    """Decode one enveloped SemBlend message of one of the ``expected`` models.

    ``deployment`` (see :func:`~semblend_dynamo.events.schemas.deployment_digest`), when given, must equal
    the message's ``deployment`` field; messages without one (hints) are checked by their consumer.
    """
    wanted = expected if isinstance(expected, tuple) else (expected,)
    env, payload_bytes = _open_envelope(data, max_bytes)
    if env["topic"] not in {topic_of(m) for m in wanted}:
        raise RejectedMessage("wrong_topic", repr(env["topic"])[:80])
    payload = _unpack(payload_bytes, "payload")
    if not isinstance(payload, dict):
        raise RejectedMessage("malformed", "payload is not a map")
    schema = payload.get("schema")
    if not isinstance(schema, str):
        raise RejectedMessage("unknown_schema", "no schema field")
    model = MODEL_BY_SCHEMA.get(schema)
    if model is None:
        prefix = schema.rsplit("/", 1)[0] + "/"
        reason = "wrong_version" if prefix in KIND_BY_PREFIX else "unknown_schema"
        raise RejectedMessage(reason, schema[:80])
    if model not in wanted:
        raise RejectedMessage("unexpected_schema", schema)
    try:
        event = model.model_validate(payload)
    except ValidationError as exc:
        raise RejectedMessage("invalid_fields", f"{schema}: {exc.error_count()} error(s)") from None
    if deployment is not None and getattr(event, "deployment", deployment) != deployment:
        raise RejectedMessage("wrong_namespace", f"{schema} from deployment {getattr(event, 'deployment', '')}")
    return event


# --- Dynamo kv-events ----------------------------------------------------------------------------


def _u64(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _U64:
        raise RejectedMessage("invalid_fields", f"{what} is not a u64")
    return value


def _kv_data(data: Any) -> KvStored | KvRemoved | KvCleared:
    if data == "cleared":
        return _CLEARED
    if not isinstance(data, dict) or len(data) != 1:
        raise RejectedMessage("invalid_fields", "event data is not stored/removed/cleared")
    ((kind, body),) = data.items()
    if not isinstance(body, dict):
        raise RejectedMessage("invalid_fields", f"{kind} body is not a map")
    if kind == "stored":
        blocks = body.get("blocks")
        if not isinstance(blocks, list) or not blocks:
            raise RejectedMessage("invalid_fields", "stored without blocks")
        block_hashes: list[int] = []
        tokens_hashes: list[int] = []
        try:
            for b in blocks:
                bh, th = b["block_hash"], b["tokens_hash"]
                # type() is exact on purpose (bool is an int subclass); msgpack ints are below 2**64 already
                if type(bh) is not int or type(th) is not int or bh < 0 or th < 0:
                    raise RejectedMessage("invalid_fields", "block_hash/tokens_hash is not a u64")
                block_hashes.append(bh)
                tokens_hashes.append(th)
        except (TypeError, KeyError):
            raise RejectedMessage("invalid_fields", "stored block lacks block_hash/tokens_hash") from None
        parent = body.get("parent_hash")
        return KvStored(block_hashes, tokens_hashes, None if parent is None else _u64(parent, "parent_hash"))
    if kind == "removed":
        hashes = body.get("block_hashes")
        if not isinstance(hashes, list):
            raise RejectedMessage("invalid_fields", "removed without block_hashes")
        if not all(type(h) is int and h >= 0 for h in hashes):
            raise RejectedMessage("invalid_fields", "removed block_hash is not a u64")
        return KvRemoved(hashes)
    raise RejectedMessage("invalid_fields", f"unknown event kind {str(kind)[:40]!r}")


def _router_event(rev: Any) -> KvEvent:
    """One RouterEvent map (msgpack or JSON form) -> :class:`KvEvent`."""
    if not isinstance(rev, dict) or not isinstance(rev.get("event"), dict):
        raise RejectedMessage("invalid_fields", "RouterEvent without event")
    inner = rev["event"]
    tier = rev.get("storage_tier", "device")
    if not isinstance(tier, str):
        raise RejectedMessage("invalid_fields", "storage_tier is not a string")
    dp_rank = inner.get("dp_rank", 0)
    if not isinstance(dp_rank, int) or isinstance(dp_rank, bool) or not 0 <= dp_rank < 1 << 32:
        raise RejectedMessage("invalid_fields", "dp_rank is not a u32")
    return KvEvent(
        _u64(rev.get("worker_id"), "worker_id"),
        _u64(inner.get("event_id"), "event_id"),
        _kv_data(inner.get("data")),
        dp_rank,
        tier,
    )


def kv_events_from_dump(text: str) -> list[KvEvent]:
    """``KvRouter.dump_events()`` output (a JSON array of RouterEvents, the recovered tree) -> events."""
    try:
        payload = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise RejectedMessage("malformed", f"dump: {exc}") from None
    if not isinstance(payload, list):
        raise RejectedMessage("malformed", "dump is not an array")
    return [_router_event(rev) for rev in payload]


def decode_kv_events(data: bytes, *, max_bytes: int) -> KvEventBatch:
    """Decode one Dynamo ``kv-events`` NATS message (envelope + msgpack array of RouterEvent maps).

    Hand-checked rather than validated field by field through pydantic: this is the router's hot
    ingest path (hundreds of thousands of blocks per second). Every field is still range-checked.
    """
    env, payload_bytes = _open_envelope(data, max_bytes)
    if env["topic"] != KV_EVENTS_TOPIC:
        raise RejectedMessage("wrong_topic", repr(env["topic"])[:80])
    payload = _unpack(payload_bytes, "payload")
    if not isinstance(payload, list):
        raise RejectedMessage("malformed", "kv-events payload is not an array")
    events = [_router_event(rev) for rev in payload]
    return KvEventBatch(env["publisher_id"], env["sequence"], env["published_at"], events)
