"""The donor policy: may a request use (or give) semantic KV, and under which rules.

Router, replay and connector ask this module; none of them writes these rules again.

* **Switches.** ``enabled=0`` turns semantic KV off; ``discovery_only=1`` finds donors but never loads them.
* **Tenants.** A request whose tenant cannot be established (:attr:`Tenancy.known` false) is its own tenant: it
  neither gets nor gives semantic KV (``tenant_unknown``). Within a tenant, namespaces keep model, LoRA and salt apart.
* **Lineage.** KV is *approximate* if any of its tokens came from a shifted load or was computed on top of
  approximate KV. Approximate KV is never exact: loading it is a shifted-mode load (``exact_materialization_only=0``,
  isolation, similarity and deviation gates, ``requires_rope_correction`` audited true), and a request holding it may
  be a donor only as an approximate donor.
* **Isolation.** Shifted mode needs ``isolation`` other than ``none``; with ``cache_salt`` every request receiving
  (or holding) approximate KV carries a per-request salt ``<tenant>|<nonce>``, so its blocks never match anyone
  else's exact prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .config import SemblendConfig
from .namespace import has_isolating_salt, tenant_of
from .outcomes import DeclineReason

SALT_ID_TENANT_PREFIX = "salt-id:"
"""Tenant of a request known only by an integer salt id: the whole salt is its tenant (no nonce can be seen)."""


class Lineage(str, Enum):
    """Whether a request's (or donor's) KV equals what a fresh prefill of its tokens computes."""

    EXACT = "exact"
    APPROXIMATE = "approximate"

    @staticmethod
    def of(*approximate: bool) -> Lineage:
        """Approximate as soon as any part is."""
        return Lineage.APPROXIMATE if any(approximate) else Lineage.EXACT

    def rope_corrected(self, rotates: bool) -> bool:
        """The audit's ``requires_rope_correction``: true when the KV is not a fresh prefill's (it is rotated now, or
        approximate in its lineage)."""
        return rotates or self is Lineage.APPROXIMATE


@dataclass(frozen=True)
class Tenancy:
    """What a request's cache salt establishes about who it belongs to."""

    known: bool
    salt: str | None = None
    """The salt string, when the engine passed one (``<tenant>|<nonce>`` isolates the request)."""
    salt_id: int | None = None
    """The engine's integer salt id, when that is all there is."""

    @classmethod
    def from_salt(cls, salt: str | None) -> Tenancy:
        """A request whose salt (possibly none) the engine told us."""
        return cls(known=True, salt=salt)

    @classmethod
    def from_salt_id(cls, salt_id: int | None) -> Tenancy:
        """A request known only by its integer salt id (None: the request has no salt)."""
        return cls(known=True, salt_id=salt_id)

    @classmethod
    def unknown(cls) -> Tenancy:
        """The engine's request carries no salt field we know: the tenant cannot be established."""
        return cls(known=False)

    @property
    def tenant(self) -> str | None:
        """The tenant donors are shared within (None: unknown, shares with nobody)."""
        if not self.known:
            return None
        if self.salt is not None:
            return tenant_of(self.salt)
        if self.salt_id is not None:
            return f"{SALT_ID_TENANT_PREFIX}{self.salt_id}"
        return ""

    @property
    def isolating(self) -> bool:
        """The request's blocks are salted with a per-request nonce (an integer id alone cannot show one)."""
        return has_isolating_salt(self.salt)


class DonorPolicy:
    """The rules of one deployment's settings; pure and cheap, so every component calls it per request."""

    def __init__(self, cfg: SemblendConfig) -> None:
        self.cfg = cfg

    @property
    def shifted(self) -> bool:
        return self.cfg.mode == "shifted"

    def may_seek(self, tenancy: Tenancy) -> DeclineReason | None:
        """Whether a request may look for donors at all (router, replay, connector); None = yes."""
        if not self.cfg.enabled:
            return DeclineReason.SEMANTIC_DISABLED
        if not tenancy.known:
            return DeclineReason.TENANT_UNKNOWN
        return None

    def may_load(self, tenancy: Tenancy, lineage: Lineage) -> DeclineReason | None:
        """Whether KV of this lineage may be loaded into this request; None = yes.

        ``lineage`` is that of the load: approximate when any token moves, follows other context, or comes from an
        approximate donor.
        """
        refused = self.may_seek(tenancy)
        if refused is not None:
            return refused
        if self.cfg.discovery_only:
            return DeclineReason.DISCOVERY_ONLY
        if lineage is Lineage.EXACT:
            return None
        if not self.shifted:
            return DeclineReason.EXACT_ONLY_MODE
        return self._isolation(tenancy)

    def may_give(self, tenancy: Tenancy, lineage: Lineage) -> DeclineReason | None:
        """Whether a finished request holding KV of this lineage may become a donor; None = yes."""
        refused = self.may_seek(tenancy)
        if refused is not None:
            return refused
        if lineage is Lineage.APPROXIMATE:
            if not self.shifted:
                return DeclineReason.APPROXIMATE_LINEAGE
            return self._isolation(tenancy)
        return None

    def device_prefix_lineage(self, tenancy: Tenancy, device_tokens: int) -> Lineage:
        """The lineage of a device prefix-cache hit: in shifted mode, KV under a per-request salt may be approximate.

        Approximate KV enters the engine's prefix cache only under an isolating salt (or not at all), so only a hit
        under such a salt can be on approximate KV; it is counted approximate without tracking every salt.
        """
        return Lineage.of(device_tokens > 0 and self.shifted and tenancy.isolating)

    def _isolation(self, tenancy: Tenancy) -> DeclineReason | None:
        if self.cfg.isolation == "none":
            return DeclineReason.ISOLATION_REQUIRED
        if self.cfg.isolation == "cache_salt" and not tenancy.isolating:
            return DeclineReason.ISOLATION_REQUIRED
        return None


def isolation_in_force_error(cfg: SemblendConfig, *, engine_block_reuse: bool) -> str | None:
    """Why the configured isolation is not in force in an engine with this block-reuse setting, or None.

    Only shifted mode produces approximate KV, so only there must isolation hold. ``no_block_reuse`` needs
    ``kv_cache_config.enable_block_reuse: false``; ``cache_salt`` needs nothing from the engine (TensorRT-LLM mixes
    the salt into the first block's hash) but requests carrying ``<tenant>|<nonce>`` salts, checked per load.
    """
    if cfg.mode != "shifted":
        return None
    if cfg.isolation == "no_block_reuse" and engine_block_reuse:
        return (
            "SEMBLEND_ISOLATION=no_block_reuse but the engine's kv_cache_config.enable_block_reuse is true: set "
            "enable_block_reuse: false in the engine YAML (semblend-trtllm print-config does), or use "
            "SEMBLEND_ISOLATION=cache_salt"
        )
    return None
