"""SemBlend's TensorRT-LLM KV-cache connector: :class:`SemBlendConnectorScheduler` and :class:`SemBlendConnectorWorker`.

Named in the engine YAML's ``kv_connector_config`` (``connector_module: trtllm_connector.connector``), which takes both
classes from one module. Settings come from ``SEMBLEND_*`` environment / the ``SEMBLEND_CONFIG`` file, because
TensorRT-LLM's ``KvCacheConnectorConfig`` rejects unknown keys.

The scheduler (rank 0, :mod:`trtllm_connector.scheduler`) decides per request whether donor KV is loaded, pins donors
and writes the plan; the workers (every rank, :mod:`trtllm_connector.worker`) copy donor KV into the target's new
blocks on the forward stream and report releases. Each module lists its TensorRT-LLM hooks in call order
(docs/trtllm.md has the API generations).

Who may get or give donor KV is :class:`~semblend_dynamo.policy.DonorPolicy`'s call: the tenant must be known
(:mod:`trtllm_connector.tenancy`), and each request's *lineage* (exact or approximate) is tracked from its device
prefix and its load to the donor it becomes, so approximate KV is never loaded or pinned as exact. Attention DP is not
supported: one rank-0 scheduler owns the donor registry and the pins of every rank.
"""

from .scheduler import SemBlendConnectorScheduler, engine_block_reuse, read_prompt
from .worker import SemBlendConnectorWorker

__all__ = ["SemBlendConnectorScheduler", "SemBlendConnectorWorker", "engine_block_reuse", "read_prompt"]
