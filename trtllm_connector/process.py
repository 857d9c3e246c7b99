"""State the scheduler and the worker of one process share.

On rank 0 TensorRT-LLM builds the scheduler and the worker in the same process (concurrently, in two threads),
and only the worker sees the KV pool. The worker publishes the pool's size and whether its shape matches the
model geometry here; the scheduler reads it to size the pin budget and to decline loads the worker could not
perform; a worker whose promised copy failed marks the request tainted, so the scheduler never pins it as a
donor. Both write to one :class:`~semblend_dynamo.audit.AuditWriter` per audit path, and a Dynamo handler shim
submits hints to the same :class:`~trtllm_connector.hints.HintInbox` the scheduler reads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from semblend_dynamo.audit import AuditWriter

from .hints import HintInbox

if TYPE_CHECKING:
    from .outcome_link import OutcomeLink


@dataclass(frozen=True)
class PoolState:
    """The KV pool as the local worker registered it."""

    num_blocks: int
    num_layers: int
    geometry_ok: bool
    """The pool's block size matches tokens_per_block * kv_heads * head_dim from the model config."""


_lock = threading.Lock()
_pool: PoolState | None = None
_audits: dict[str | None, AuditWriter] = {}
_hints: HintInbox | None = None
_tainted: set[int] = set()
_link: OutcomeLink | None = None


def publish_pool(state: PoolState) -> None:
    """Called by the worker from ``register_kv_caches``."""
    global _pool
    with _lock:
        _pool = state


def pool_state() -> PoolState | None:
    with _lock:
        return _pool


def shared_audit(path: str | None) -> AuditWriter:
    """The process's audit writer for ``path`` (None: one in-memory writer)."""
    with _lock:
        writer = _audits.get(path)
        if writer is None:
            writer = _audits[path] = AuditWriter(path)
        return writer


def shared_hints() -> HintInbox:
    """The process's hint inbox: handler shims and the NATS link submit, the scheduler takes."""
    global _hints
    with _lock:
        if _hints is None:
            _hints = HintInbox()
        return _hints


def taint(request_id: int) -> None:
    """A promised load was not performed: the request's KV is wrong and it must never become a donor."""
    with _lock:
        _tainted.add(request_id)


def pop_taint(request_id: int) -> bool:
    """Called from ``request_finished``: whether the request was tainted (and forget it)."""
    with _lock:
        if request_id in _tainted:
            _tainted.discard(request_id)
            return True
        return False


def publish_link(link: OutcomeLink) -> None:
    """Called by the scheduler that started the process's NATS link; the rank-0 worker publishes through it too."""
    global _link
    with _lock:
        _link = link


def outcome_link() -> OutcomeLink | None:
    with _lock:
        return _link
