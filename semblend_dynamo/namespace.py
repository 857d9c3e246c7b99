"""Who may share KV with whom: the namespace key, the model identity it is built from, and tenants.

Two requests may share KV only if every field of their :class:`NamespaceKey` is equal. A mismatch is a decline
(``namespace_mismatch``), never a warning. Router, replay and connector all build keys through
:class:`ModelIdentity`, so a key means the same thing on every floor.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from .config import read_model_config
from .tokenizer import tokenizer_fingerprint

if TYPE_CHECKING:
    from .config import SemblendConfig

TENANT_SEPARATOR = "|"
"""A cache salt ``<tenant>|<nonce>`` names the tenant before the separator (see :func:`tenant_of`)."""


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
        return _digest(self)

    def with_salt(self, cache_salt: str | None) -> NamespaceKey:
        """The same key for another tenant / cache salt."""
        return self.model_copy(update={"cache_salt": cache_salt or ""})


@functools.lru_cache(maxsize=4096)
def _digest(key: NamespaceKey) -> str:
    """Memoized: a request asks for its key's digest several times (discovery, hint, evidence)."""
    canonical = json.dumps(key.model_dump(), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


class ModelIdentity(BaseModel):
    """The deployment-wide part of the namespace key: what one model served on one KV layout is."""

    model_config = ConfigDict(frozen=True)

    model_id: str = Field(min_length=1)
    tokenizer_fingerprint: str = ""
    tokens_per_block: int = Field(gt=0)
    kv_dtype: str = "bfloat16"
    layout_order: str = "head_major"
    rope_fingerprint: str = ""

    def namespace(self, *, lora: str = "", tenant: str = "") -> NamespaceKey:
        """The namespace key of one request of this deployment."""
        return NamespaceKey(
            model_id=self.model_id,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            tokens_per_block=self.tokens_per_block,
            kv_dtype=self.kv_dtype,
            kv_layout=f"trtllm_{self.layout_order}",
            lora=lora,
            cache_salt=tenant,
            rope_fingerprint=self.rope_fingerprint,
        )

    @classmethod
    def from_config(
        cls,
        cfg: SemblendConfig,
        *,
        tokens_per_block: int | None = None,
        kv_dtype: str | None = None,
        layout_order: str = "head_major",
    ) -> ModelIdentity:
        """The identity every component derives from the shared settings (engine facts override where known).

        The RoPE fingerprint comes only from ``SEMBLEND_ROPE_CONFIG``: it is the setting routers and workers share,
        so a fingerprint read from an engine's model directory would make the worker's keys differ from the router's.
        """
        rope = rope_fingerprint(read_model_config(cfg.rope_config)) if cfg.rope_config else ""
        return cls(
            model_id=cfg.model_id,
            tokenizer_fingerprint=tokenizer_fingerprint(cfg.tokenizer),
            tokens_per_block=tokens_per_block or cfg.block_size,
            kv_dtype=kv_dtype or cfg.kv_dtype,
            layout_order=layout_order,
            rope_fingerprint=rope,
        )


def rope_fingerprint(hf_config: dict[str, Any]) -> str:
    """The RoPE fingerprint of a model config ("" when its RoPE cannot be corrected: such keys match nothing shifted)."""
    try:
        from semblend_kernels.rope import RopeConfig, UnsupportedRope
    except ImportError:  # the kernels need torch; a router without it shares keys only with workers lacking it too
        return ""
    try:
        return RopeConfig.from_hf_config(hf_config).fingerprint()
    except UnsupportedRope:
        return ""


def tenant_of(cache_salt: str | None) -> str:
    """The tenant part of a cache salt: donors are shared within a tenant, never across.

    With ``isolation=cache_salt`` each SemBlend-eligible request carries ``<tenant>|<unique nonce>``: the nonce keeps
    its (possibly approximate) blocks out of everyone's exact prefix cache, the tenant keeps donor search in bounds.
    """
    return (cache_salt or "").split(TENANT_SEPARATOR, 1)[0]


def has_isolating_salt(cache_salt: str | None) -> bool:
    """True when the salt carries a per-request nonce after the tenant."""
    salt = str(cache_salt or "")
    return TENANT_SEPARATOR in salt and bool(salt.split(TENANT_SEPARATOR, 1)[1])


def isolating_salt(tenant: str, nonce: str) -> str:
    """The cache salt that isolates one request's KV inside its tenant."""
    return f"{tenant}{TENANT_SEPARATOR}{nonce}"
