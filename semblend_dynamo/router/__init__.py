"""The SemBlend semantic router: a Dynamo component in front of the TensorRT-LLM workers (docs/router.md).

``__main__`` (``semblend-dynamo router`` / ``python -m semblend_dynamo.router``) wires the runtime;
:mod:`.handler` holds the request path (:class:`~.handler.SemanticRouter`, :func:`~.handler.discover_resident`),
:mod:`.residency` the per-worker block mirror and donor catalog, :mod:`.metrics` and :mod:`.health` the
Prometheus metrics and the ``/healthz`` side door.
"""
