"""The SemBlend semantic router: a Dynamo component in front of the TensorRT-LLM workers (docs/router.md).

``__main__`` (``semblend-dynamo router`` / ``python -m semblend_dynamo.router``) wires the runtime;
:mod:`.handler` holds the request path (:class:`~.handler.SemanticRouter`),
:mod:`.catalog` the donor state behind one lock (over :mod:`.residency`, the per-worker block mirror),
:mod:`.embedding` prompt embeddings off the event loop, :mod:`.sync` bounded donor-sync replies, :mod:`.metrics`
and :mod:`.health` the Prometheus metrics and the ``/healthz`` side door.
"""
