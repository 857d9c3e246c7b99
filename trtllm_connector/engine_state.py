"""State one engine's connector scheduler and worker share, and nothing else does.

On rank 0 TensorRT-LLM builds the scheduler and the worker of one engine in the same process (concurrently, in two
threads), both from the engine's ``llm_args``. Only the worker sees the KV pool: it publishes the pool's size and
whether its shape matches the model geometry; the scheduler reads it to size the pin budget and to decline loads the
worker could not perform. A worker whose promised copy failed marks the request tainted, so the scheduler never pins
it. Both write through one :class:`~semblend_dynamo.audit.AuditWriter`, the worker publishes outcomes through the
scheduler's NATS link, and that link feeds the router's hints into the scheduler's
:class:`~trtllm_connector.hints.HintInbox`.

The state is keyed by the ``llm_args`` object itself (identity, not equality), so two engines in one process, even
with equal settings, never see each other's pins, taints, hints or pool.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from semblend_dynamo.audit import AuditWriter

from .hints import HintInbox

if TYPE_CHECKING:
    from .outcome_link import OutcomeLink


@dataclass(frozen=True)
class PoolState:
    """The KV pool as the engine's worker registered it."""

    num_blocks: int
    num_layers: int
    geometry_ok: bool
    """The pool's block size matches tokens_per_block * kv_heads * head_dim from the model config."""
    layer_groups: int = 1
    """KV layer groups the engine reported (more than one: variable sliding-window attention, declined)."""


_engines_lock = threading.Lock()
_engines: dict[int, tuple[Any, EngineState]] = {}
"""Each live engine's state by ``id(llm_args)``, with a reference that checks the id still names that engine."""


class EngineState:
    """Pool facts, taints, the audit writer, the hint inbox and the NATS link of one engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: PoolState | None = None
        self._tainted: set[int] = set()
        self._audit: AuditWriter | None = None
        self._link: OutcomeLink | None = None
        self.hints = HintInbox()

    @classmethod
    def of(cls, llm_args: Any) -> EngineState:
        """The state of the engine built from this ``llm_args`` object (created on first use)."""
        key = id(llm_args)
        with _engines_lock:
            entry = _engines.get(key)
            if entry is not None and _referent(entry[0]) is llm_args:
                return entry[1]
            state = cls()
            _engines[key] = (_reference(llm_args, key), state)
            return state

    # --- pool ----------------------------------------------------------------------------------
    def publish_pool(self, state: PoolState) -> None:
        """Called by the worker from ``register_kv_caches``."""
        with self._lock:
            self._pool = state

    def pool_state(self) -> PoolState | None:
        with self._lock:
            return self._pool

    # --- taints --------------------------------------------------------------------------------
    def taint(self, request_id: int) -> None:
        """A promised load was not performed: the request's KV is wrong and it must never become a donor."""
        with self._lock:
            self._tainted.add(request_id)

    def pop_taint(self, request_id: int) -> bool:
        """Called from ``request_finished``: whether the request was tainted (and forget it)."""
        with self._lock:
            if request_id in self._tainted:
                self._tainted.discard(request_id)
                return True
            return False

    # --- audit and link ------------------------------------------------------------------------
    def audit(self, path: str | None) -> AuditWriter:
        """The engine's audit writer (None: in memory); the scheduler and the worker share it."""
        with self._lock:
            if self._audit is None:
                self._audit = AuditWriter(path)
            return self._audit

    def publish_link(self, link: OutcomeLink) -> None:
        """Called by the scheduler that started the engine's NATS link; the rank-0 worker publishes through it too."""
        with self._lock:
            self._link = link

    def outcome_link(self) -> OutcomeLink | None:
        with self._lock:
            return self._link


def _reference(obj: Any, key: int) -> Any:
    """A weak reference that forgets the engine's state with the engine (a strong one where weakrefs are refused)."""
    try:
        return weakref.ref(obj, lambda _: _engines.pop(key, None))
    except TypeError:
        return obj


def _referent(ref: Any) -> Any:
    return ref() if isinstance(ref, weakref.ref) else ref
