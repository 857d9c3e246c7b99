"""Donor lifecycle on one worker: pins, leases, generations and the pin budget.

A finished request becomes a *donor* when ``request_finished`` returns True for it, which keeps its blocks
(ids and contents) until the worker reports it in ``finished_saving`` (docs/architecture.md: the only residency
guarantee TensorRT-LLM offers). The registry decides which donors to keep:

* **Budget.** Blocks held by donors (pinned, plus those whose release is on its way) never exceed
  ``budget_blocks``, at every instant. Released blocks are free only after the workers report them (next
  iteration), so after each admission least-recently-used donors are released until the largest donor seen so far
  would fit again; a donor that still does not fit is refused (``capacity``) and makes room for the next one.
* **TTL / LRU.** A donor not used for ``ttl_s`` seconds is released at the next :meth:`DonorRegistry.tick`.
* **Leases.** A donor named in a promise is leased until its copy is in the connector metadata; leased donors are
  never released.
* **Generations.** Every admission gets a new generation number. If any of a donor's blocks is reported as newly
  allocated to another request, the donor is invalidated (``generation_mismatch``): its content can no longer be
  trusted, whatever TensorRT-LLM promised.

Releases leave the registry in two steps: :meth:`take_releases` hands the request ids to the scheduler, which
puts them in the connector metadata; each worker reports them in ``get_finished`` that same iteration, so the
blocks are free by the next :meth:`take_releases` call.
"""

from __future__ import annotations

import array
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from semblend_dynamo.events.schemas import request_key, u32_tokens
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.policy import Lineage

TOMBSTONES = 4096
"""Recently released donors remembered so a late hint is declined with the real reason."""


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share (argmax stops at the first mismatch; no index array is built)."""
    n = min(len(a), len(b))
    differ = a[:n] != b[:n]
    first = int(differ.argmax()) if n else 0
    return first if n and differ[first] else n


@dataclass
class Donor:
    """One pinned donor: the prompt tokens whose KV is resident in ``block_ids``."""

    donor_id: str
    request_id: int
    namespace: NamespaceKey
    namespace_digest: str
    tokens: np.ndarray
    """uint32, read-only: what a decision compares with the prompt (also uint32) and the span aligner indexes (shared,
    not copied)."""
    block_ids: tuple[int, ...]
    generation: int
    last_used: float
    leases: int = 0
    lineage: Lineage = Lineage.EXACT
    """Approximate: some of the donor's KV came from a shifted load or was computed on top of one."""
    key: str = ""
    """``request_key`` of the donor's prompt: what a router hint names it by (``DonorHint.donor_key``)."""
    block_hashes: tuple[int, ...] = ()
    """TensorRT-LLM 1.3+: the engine's hash chain of the donor's full blocks (empty when the engine gives none)."""
    cache_salt: str | None = None
    """The salt string the engine mixed into ``block_hashes`` (1.3+ ``RequestData.cache_salt``)."""

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


@dataclass
class AdmitResult:
    """What :meth:`DonorRegistry.admit` decided: the donor (None when refused) and why not."""

    donor: Donor | None
    reason: DeclineReason | None = None
    released: list[Donor] = field(default_factory=list)


class DonorRegistry:
    """The donors pinned on one worker. Not thread-safe: the scheduler calls it from one thread."""

    def __init__(
        self,
        budget_blocks: int,
        ttl_s: float,
        *,
        tokens_per_block: int = 32,
        worker_id: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_blocks = budget_blocks
        self.tokens_per_block = tokens_per_block
        self.ttl_s = ttl_s
        self.worker_id = worker_id
        self._clock = clock
        self._live: OrderedDict[str, Donor] = OrderedDict()  # LRU order: oldest use first
        self._by_block: dict[int, set[str]] = {}
        self._by_first_block: dict[tuple[str, bytes], list[str]] = {}  # newest last
        self._by_key: dict[str, str] = {}  # prompt request_key -> the newest live donor of that prompt
        self._pending_release: list[Donor] = []
        self._in_flight_blocks = 0  # blocks of releases handed out but possibly not yet freed
        self._tombstones: OrderedDict[str, DeclineReason] = OrderedDict()
        self._generation = 0
        self._largest = 0  # blocks of the largest donor admitted: the room kept free for the next one
        self.pinned_blocks = 0

    # --- queries -------------------------------------------------------------------------------
    @property
    def held_blocks(self) -> int:
        """Blocks kept out of the pool by donors: pinned, waiting for release, and released this iteration."""
        return self.pinned_blocks + sum(d.num_blocks for d in self._pending_release) + self._in_flight_blocks

    def __len__(self) -> int:
        return len(self._live)

    def donors(self) -> Iterable[Donor]:
        return self._live.values()

    def get(self, donor_id: str) -> Donor | None:
        return self._live.get(donor_id)

    def by_key(self, key: str) -> Donor | None:
        """The live donor whose prompt has this ``request_key`` (the router names donors by it, not by our ids)."""
        donor_id = self._by_key.get(key)
        return self._live.get(donor_id) if donor_id is not None else None

    def longest_prefix(self, namespace_digest: str, target: np.ndarray, max_candidates: int = 16) -> tuple[str, int]:
        """The donor sharing the longest token prefix with ``target`` and that length (``("", 0)`` if none).

        Exact-equivalent KV is only ever a shared prefix, so exact mode needs no span search: donors are keyed by
        their first block, and the newest ``max_candidates`` with the target's first block are compared directly.
        ``target`` holds the token ids as integers of any width; it is compared with the donors' uint32 arrays (the
        connector passes its uint32 prompt: same width, no conversion).
        """
        tpb = self.tokens_per_block
        if len(target) < tpb:
            return "", 0
        best, best_len = "", 0
        candidates = self._by_first_block.get((namespace_digest, _block_key(target[:tpb])), ())
        for donor_id in reversed(candidates[-max_candidates:]):
            tokens = self._live[donor_id].tokens
            length = shared_prefix(tokens, target)
            if length > best_len:
                best, best_len = donor_id, length
        return best, best_len

    def why_gone(self, donor_id: str) -> DeclineReason:
        """The decline reason for a donor id that is not live (unknown ids: ``donor_not_resident``)."""
        return self._tombstones.get(donor_id, DeclineReason.DONOR_NOT_RESIDENT)

    def donor_id_for(self, request_id: int) -> str:
        return f"{self.worker_id:x}:{request_id}"

    # --- lifecycle -----------------------------------------------------------------------------
    def admit(
        self,
        request_id: int,
        namespace: NamespaceKey,
        tokens: Sequence[int],
        block_ids: Sequence[int],
        lineage: Lineage = Lineage.EXACT,
        *,
        block_hashes: Sequence[int] = (),
        cache_salt: str | None = None,
    ) -> AdmitResult:
        """Called from ``request_finished``: pin the finished request as a donor if the budget allows.

        Raises ValueError for token ids outside ``[0, 2**32)``.
        """
        need = len(block_ids)
        released = self.tick()
        if need == 0 or need > self.budget_blocks:
            return AdmitResult(None, DeclineReason.CAPACITY, released)
        if self.held_blocks + need > self.budget_blocks:
            released += self._release_lru(need)
            return AdmitResult(None, DeclineReason.CAPACITY, released)
        # One unboxing of the token list feeds both the key and the array (np.fromiter took 3-4x as long); the
        # connector passes the u32 array it made when it decided on the request.
        if isinstance(tokens, array.array) and tokens.typecode == "I":
            tokens_u32 = tokens
        else:
            try:
                tokens_u32 = u32_tokens(tokens)
            except (OverflowError, TypeError) as exc:
                raise ValueError(f"token ids must be integers in [0, 2**32): {exc}") from None
        token_u32 = np.frombuffer(tokens_u32, dtype=np.uint32).copy()  # ours: the caller may change its array
        token_u32.flags.writeable = False
        self._largest = max(self._largest, need)
        self._generation += 1
        now = self._clock()
        donor = Donor(
            donor_id=self.donor_id_for(request_id),
            request_id=request_id,
            namespace=namespace,
            namespace_digest=namespace.digest(),
            tokens=token_u32,
            block_ids=tuple(block_ids),
            generation=self._generation,
            last_used=now,
            lineage=lineage,
            key=request_key(tokens_u32),
            block_hashes=tuple(block_hashes),
            cache_salt=cache_salt,
        )
        self._live[donor.donor_id] = donor
        self._by_key[donor.key] = donor.donor_id
        self._tombstones.pop(donor.donor_id, None)
        for b in donor.block_ids:
            self._by_block.setdefault(b, set()).add(donor.donor_id)
        if len(token_u32) >= self.tokens_per_block:
            self._by_first_block.setdefault(self._first_block_key(donor), []).append(donor.donor_id)
        self.pinned_blocks += need
        # Keep room for the next donor once this iteration's releases are freed, so it need not be refused.
        released += self._release_lru(self._largest, keep=donor.donor_id)
        return AdmitResult(donor, None, released)

    def touch(self, donor: Donor) -> None:
        """A donor was used (or chosen): refresh its TTL and LRU position."""
        donor.last_used = self._clock()
        self._live.move_to_end(donor.donor_id)

    def lease(self, donor: Donor) -> None:
        donor.leases += 1
        self.touch(donor)

    def unlease(self, donor_id: str) -> None:
        donor = self._live.get(donor_id)
        if donor is not None and donor.leases > 0:
            donor.leases -= 1

    def tick(self) -> list[Donor]:
        """Release donors whose TTL ran out (leased ones excepted). Returns the donors released."""
        deadline = self._clock() - self.ttl_s
        expired = []
        for donor in self._live.values():  # least recently used first: stop at the first one still fresh
            if donor.last_used > deadline:
                break
            if donor.leases == 0:
                expired.append(donor)
        return [self._release(d, DeclineReason.DONOR_LEASE_EXPIRED) for d in expired]

    def note_allocation(self, block_ids: Iterable[int]) -> list[Donor]:
        """Called with blocks newly allocated to a request: any live donor holding one is invalidated."""
        hit: set[str] = set()
        for b in block_ids:
            owners = self._by_block.get(b)
            if owners:
                hit |= owners
        out = []
        for donor_id in hit:
            donor = self._live[donor_id]
            donor.generation = -donor.generation  # never equal to a promise's snapshot again
            out.append(self._release(donor, DeclineReason.GENERATION_MISMATCH))
        return out

    def evict(self, donor_id: str) -> Donor | None:
        """Release one donor now (pressure, operator or test); leased donors are kept."""
        donor = self._live.get(donor_id)
        if donor is None or donor.leases:
            return None
        return self._release(donor, DeclineReason.DONOR_EVICTED)

    def take_releases(self) -> list[int]:
        """Called once per iteration from ``build_connector_meta``: request ids the workers must now report.

        Releases handed out by the previous call have been reported by every worker by now (``get_finished``
        ends each iteration), so their blocks stop counting against the budget.
        """
        out = [d.request_id for d in self._pending_release]
        self._in_flight_blocks = sum(d.num_blocks for d in self._pending_release)
        self._pending_release = []
        return out

    # --- internals -----------------------------------------------------------------------------
    def _release_lru(self, need: int, keep: str | None = None) -> list[Donor]:
        """Release least-recently-used donors until ``need`` more blocks fit once pending releases are freed."""
        out: list[Donor] = []
        for donor in list(self._live.values()):
            if self.pinned_blocks + need <= self.budget_blocks:
                break
            if donor.leases == 0 and donor.donor_id != keep:
                out.append(self._release(donor, DeclineReason.DONOR_EVICTED))
        return out

    def _release(self, donor: Donor, reason: DeclineReason) -> Donor:
        del self._live[donor.donor_id]
        if self._by_key.get(donor.key) == donor.donor_id:
            del self._by_key[donor.key]
        for b in donor.block_ids:
            owners = self._by_block.get(b)
            if owners is not None:
                owners.discard(donor.donor_id)
                if not owners:
                    del self._by_block[b]
        if len(donor.tokens) >= self.tokens_per_block:
            key = self._first_block_key(donor)
            same_start = self._by_first_block[key]
            same_start.remove(donor.donor_id)
            if not same_start:
                del self._by_first_block[key]
        self.pinned_blocks -= donor.num_blocks
        self._pending_release.append(donor)
        self._tombstones[donor.donor_id] = reason
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)
        return donor

    def _first_block_key(self, donor: Donor) -> tuple[str, bytes]:
        return donor.namespace_digest, _block_key(donor.tokens[: self.tokens_per_block])


def _block_key(tokens: np.ndarray) -> bytes:
    """A first block's index key: its ids as uint32 bytes, whatever the array's integer width.

    An id too wide for 32 bits wraps here, so it only adds a candidate; candidates are compared token by token.
    """
    return tokens.astype(np.uint32, copy=False).tobytes()
