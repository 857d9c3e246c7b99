"""The namespace key: reuse never crosses it (DESIGN.md §3.3).

Two requests may share KV only if every field of their :class:`NamespaceKey` is equal. A mismatch is a
decline (``namespace_mismatch``), never a warning.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field


class NamespaceKey(BaseModel):
    """Everything that must match for KV computed for one request to be valid for another."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str = Field(min_length=1)
    tokenizer_fingerprint: str = ""
    tokens_per_block: int = Field(gt=0)
    kv_dtype: str = "bfloat16"
    kv_layout: str = "trtllm_head_major"
    lora: str = ""
    cache_salt: str = ""
    rope_fingerprint: str = ""

    def digest(self) -> str:
        """A short stable identifier for this key (16 hex chars of BLAKE2b over the canonical JSON)."""
        canonical = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()

    def with_salt(self, cache_salt: str | None) -> NamespaceKey:
        """The same key for another tenant / cache salt."""
        return self.model_copy(update={"cache_salt": cache_salt or ""})


def fingerprint_file(path: str) -> str:
    """BLAKE2b fingerprint of a file (e.g. a ``tokenizer.json``), used as the tokenizer fingerprint."""
    h = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
