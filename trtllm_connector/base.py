"""TensorRT-LLM's KV-cache connector base classes, or local stand-ins with the same signatures.

When ``tensorrt_llm`` is importable the real classes are used, from the 1.3+ module path
(``_torch.pyexecutor.connectors.kv_cache_connector``) or else the 1.1/1.2 one (``_torch.pyexecutor.kv_cache_connector``).
Otherwise local stand-ins are used, so the connector can be built and driven by the PyExecutor harness
(:mod:`trtllm_connector.harness`) on machines without TensorRT-LLM's GPU wheels. There is one stand-in set per API
generation (:data:`STAND_INS`), each reproducing that generation's members and signatures:

* ``"1.2"``: ``RequestData(request_id, new_tokens, new_block_ids, computed_position, num_scheduled_tokens)``, four
  abstract scheduler methods plus ``wait_for_initialization``, six abstract worker methods.
* ``"1.3"``: adds ``RequestData.block_hashes`` / ``priorities`` / ``cache_salt`` / ``new_block_ids_by_layer_group``,
  ``SchedulerOutput.attention_dp_rank``, the class attribute ``supports_attention_dp`` (False) on both classes, and the
  optional scheduler hooks ``request_reset(request)``, ``cancel_load(request, start, end)``,
  ``update_state_after_alloc_by_layer_group`` / ``request_finished_by_layer_group`` and the worker's
  ``register_forward_pass_callable`` / ``register_kv_cache_layout``.

Without TensorRT-LLM the connector subclasses the ``"1.3"`` stand-ins (a superset: the 1.2 runtime never calls the
extra hooks). Fields a generation may lack are read with ``getattr``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

TRTLLM_MODULE_PATHS = (
    "tensorrt_llm._torch.pyexecutor.connectors.kv_cache_connector",
    "tensorrt_llm._torch.pyexecutor.kv_cache_connector",
)
API_GENERATIONS = ("1.3", "1.2")
"""The API generation of each path in :data:`TRTLLM_MODULE_PATHS`, in the same order."""


def _import_trtllm() -> tuple[Any, str] | None:
    import importlib

    for path in TRTLLM_MODULE_PATHS:
        try:
            module = importlib.import_module(path)
        except ImportError:
            continue
        if all(hasattr(module, n) for n in ("KvCacheConnectorScheduler", "KvCacheConnectorWorker", "SchedulerOutput")):
            return module, path
    return None


# --- TensorRT-LLM 1.1/1.2 stand-ins ------------------------------------------------------------------------------
@dataclass
class Local12RequestData:
    """Stand-in for 1.2's ``RequestData`` (one entry per scheduled request)."""

    request_id: int
    new_tokens: list[int]
    new_block_ids: list[int]
    computed_position: int
    num_scheduled_tokens: int = 0


@dataclass
class Local12SchedulerOutput:
    """Stand-in for 1.2's ``SchedulerOutput``."""

    new_requests: list[Any] = field(default_factory=list)
    cached_requests: list[Any] = field(default_factory=list)


class Local12KvCacheConnectorScheduler(ABC):
    """Stand-in for 1.2's ``KvCacheConnectorScheduler`` (rank 0 only)."""

    def __init__(self, llm_args: Any) -> None:
        self._llm_args = llm_args

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> object: ...

    @abstractmethod
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]: ...

    @abstractmethod
    def update_state_after_alloc(self, request: Any, block_ids: list[int]) -> None: ...

    @abstractmethod
    def request_finished(self, request: Any, cache_block_ids: list[int]) -> bool: ...

    def wait_for_initialization(self) -> None:
        return None


class Local12KvCacheConnectorWorker(ABC):
    """Stand-in for 1.2's ``KvCacheConnectorWorker`` (every rank)."""

    def __init__(self, llm_args: Any) -> None:
        self._llm_args = llm_args
        self._metadata: object | None = None

    def bind_connector_meta(self, metadata: object) -> None:
        self._metadata = metadata

    def get_connector_meta(self) -> object | None:
        return self._metadata

    def _clear_connector_meta(self) -> None:
        self._metadata = None

    @abstractmethod
    def register_kv_caches(self, kv_cache_tensor: Any) -> None: ...

    @abstractmethod
    def start_load_kv(self, stream: Any) -> None: ...

    @abstractmethod
    def wait_for_layer_load(self, layer_idx: int, stream: Any) -> None: ...

    @abstractmethod
    def save_kv_layer(self, layer_idx: int, stream: Any) -> None: ...

    @abstractmethod
    def wait_for_save(self, stream: Any) -> None: ...

    @abstractmethod
    def get_finished(
        self, finished_gen_req_ids: list[int], started_loading_req_ids: list[int]
    ) -> tuple[list[int], list[int]]: ...


# --- TensorRT-LLM 1.3+ stand-ins ---------------------------------------------------------------------------------
@dataclass
class Local13RequestData(Local12RequestData):
    """Stand-in for 1.3+'s ``RequestData``.

    ``block_hashes``: the cumulative hash chain of the request's full blocks (beam 0), the same values KV-cache events
    report; ``cache_salt``: the request's salt string, which connectors must mix into their content keys;
    ``new_block_ids_by_layer_group``: per layer group page indices (empty for a single flat space, -1 = no page).
    """

    block_hashes: list[int] = field(default_factory=list)
    priorities: list[int] | None = None
    cache_salt: str | None = None
    new_block_ids_by_layer_group: list[list[int]] = field(default_factory=list)


@dataclass
class Local13SchedulerOutput(Local12SchedulerOutput):
    """Stand-in for 1.3+'s ``SchedulerOutput`` (``attention_dp_rank``: None on the tensor-parallel path)."""

    attention_dp_rank: int | None = None


class Local13KvCacheConnectorScheduler(Local12KvCacheConnectorScheduler):
    """Stand-in for 1.3+'s ``KvCacheConnectorScheduler`` (rank 0, or every attention-DP owner that opted in)."""

    supports_attention_dp: bool = False

    def request_finished_by_layer_group(self, request: Any, cache_block_ids_by_layer_group: list[list[int]]) -> bool:
        if len(cache_block_ids_by_layer_group) != 1:
            raise NotImplementedError("request_finished_by_layer_group with more than one layer group")
        return self.request_finished(request, cache_block_ids_by_layer_group[0])

    def update_state_after_alloc_by_layer_group(self, request: Any, block_ids_by_layer_group: list[list[int]]) -> None:
        if len(block_ids_by_layer_group) != 1:
            raise NotImplementedError("update_state_after_alloc_by_layer_group with more than one layer group")
        self.update_state_after_alloc(request, block_ids_by_layer_group[0])

    def request_reset(self, request: Any) -> None:
        """The request's allocation was released; it will run again from the start (no-op default)."""
        return None

    def cancel_load(self, request: Any, start: int, end: int) -> None:
        """The runtime will not consume offered KV for prompt tokens ``[start, end)`` (no-op default)."""
        return None


class Local13KvCacheConnectorWorker(Local12KvCacheConnectorWorker):
    """Stand-in for 1.3+'s ``KvCacheConnectorWorker``."""

    supports_attention_dp: bool = False

    def register_forward_pass_callable(self) -> Any:
        return None

    def register_kv_cache_layout(self, layout: Any) -> None:
        tensor = layout.as_single_pool_tensor()
        if tensor is None:
            raise NotImplementedError("this KV cache cannot be described as one pool tensor")
        self.register_kv_caches(tensor)


class StandIns(NamedTuple):
    """One API generation's stand-in classes."""

    scheduler: type
    worker: type
    scheduler_output: type
    request_data: type


STAND_INS: dict[str, StandIns] = {
    "1.2": StandIns(
        Local12KvCacheConnectorScheduler, Local12KvCacheConnectorWorker, Local12SchedulerOutput, Local12RequestData
    ),
    "1.3": StandIns(
        Local13KvCacheConnectorScheduler, Local13KvCacheConnectorWorker, Local13SchedulerOutput, Local13RequestData
    ),
}

_found = _import_trtllm()
TRTLLM_CONNECTOR_MODULE: str | None = _found[1] if _found else None
"""The TensorRT-LLM module the base classes came from; None when the local stand-ins are in use."""
API_GENERATION: str = API_GENERATIONS[TRTLLM_MODULE_PATHS.index(_found[1])] if _found else "1.3"
"""The connector API generation in use ("1.2" or "1.3"; the stand-ins are "1.3")."""

if TYPE_CHECKING:
    KvCacheConnectorScheduler = Local13KvCacheConnectorScheduler
    KvCacheConnectorWorker = Local13KvCacheConnectorWorker
    SchedulerOutput = Local13SchedulerOutput
    RequestData = Local13RequestData
elif _found is not None:
    KvCacheConnectorScheduler = _found[0].KvCacheConnectorScheduler
    KvCacheConnectorWorker = _found[0].KvCacheConnectorWorker
    SchedulerOutput = _found[0].SchedulerOutput
    RequestData = getattr(_found[0], "RequestData", STAND_INS[API_GENERATION].request_data)
else:
    KvCacheConnectorScheduler = Local13KvCacheConnectorScheduler
    KvCacheConnectorWorker = Local13KvCacheConnectorWorker
    SchedulerOutput = Local13SchedulerOutput
    RequestData = Local13RequestData
