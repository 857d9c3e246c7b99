"""TensorRT-LLM's KV-cache connector base classes, or local stand-ins with the same signatures.

When ``tensorrt_llm`` is importable the real classes are used, from the newer module path
(``_torch.pyexecutor.connectors.kv_cache_connector``) or the 1.1/1.2 one (``_torch.pyexecutor.kv_cache_connector``).
Otherwise the local ABCs below stand in, so the connector can be built and driven by the PyExecutor harness
(:mod:`trtllm_connector.harness`) on machines without TensorRT-LLM's GPU wheels. Only the members the 1.2 API
documents are reproduced; optional :class:`RequestData` fields added later (``block_hashes``, ``cache_salt``,
``priorities``) must be read with ``getattr``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

TRTLLM_MODULE_PATHS = (
    "tensorrt_llm._torch.pyexecutor.connectors.kv_cache_connector",
    "tensorrt_llm._torch.pyexecutor.kv_cache_connector",
)


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


@dataclass
class LocalRequestData:
    """Local stand-in for TensorRT-LLM's ``RequestData`` (one entry per scheduled request)."""

    request_id: int
    new_tokens: list[int]
    new_block_ids: list[int]
    computed_position: int
    num_scheduled_tokens: int = 0


@dataclass
class LocalSchedulerOutput:
    """Local stand-in for TensorRT-LLM's ``SchedulerOutput``."""

    new_requests: list[Any] = field(default_factory=list)
    cached_requests: list[Any] = field(default_factory=list)


class LocalKvCacheConnectorScheduler(ABC):
    """Local stand-in for ``KvCacheConnectorScheduler`` (rank 0 only)."""

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


class LocalKvCacheConnectorWorker(ABC):
    """Local stand-in for ``KvCacheConnectorWorker`` (every rank)."""

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


_found = _import_trtllm()
TRTLLM_CONNECTOR_MODULE: str | None = _found[1] if _found else None
"""The TensorRT-LLM module the base classes came from; None when the local stand-ins are in use."""

if TYPE_CHECKING:
    KvCacheConnectorScheduler = LocalKvCacheConnectorScheduler
    KvCacheConnectorWorker = LocalKvCacheConnectorWorker
    SchedulerOutput = LocalSchedulerOutput
    RequestData = LocalRequestData
elif _found is not None:
    KvCacheConnectorScheduler = _found[0].KvCacheConnectorScheduler
    KvCacheConnectorWorker = _found[0].KvCacheConnectorWorker
    SchedulerOutput = _found[0].SchedulerOutput
    RequestData = getattr(_found[0], "RequestData", LocalRequestData)
else:
    KvCacheConnectorScheduler = LocalKvCacheConnectorScheduler
    KvCacheConnectorWorker = LocalKvCacheConnectorWorker
    SchedulerOutput = LocalSchedulerOutput
    RequestData = LocalRequestData
