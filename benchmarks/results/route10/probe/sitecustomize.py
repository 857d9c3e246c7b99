"""Diagnostic probe of the semantic router's span path through the Frontend benchmark (session 12, branch route10).

Put this folder on ``PYTHONPATH`` and set ``ROUTE10_PROBE=<dir>``: every Python process started with both imports it
(``sitecustomize``); in the semantic router (``SEMBLEND_ENABLED=1``) it wraps the span path's steps and appends one
JSON line per hinted request to ``<dir>/probe_<pid>.jsonl``: each mark's (wall, thread CPU) time and the background
work (donor embedding, donor thread, indexer, kv-events) that ran from 50 ms before the request on. Wall minus
thread CPU of a step is time the loop's thread did not run in it: waiting for the GIL (or preempted).
``span_probe_report.py`` reads the lines. Example, from the repo root:

    ROUTE10_PROBE=<dir> PYTHONPATH=$PWD:$PWD/benchmarks/results/route10/probe \\
        python -m benchmarks.frontend_path.run --donors 20000 --requests 150

Marks: p0 parse; l0 load query asked; x0/x1 exact query asked (the call); s0/s1 ``_spans_during_exact``; g0/g1 the
exact-wins gate; st0/st1 ``DonorCatalog.stored_together``; f0/f1 ``find_spans``; a0/a1 ``SpanAligner.align``; n0/n1
the compiled call (``_native.AlignCall.run``, or ``_native.align`` before it); h0/h1 the hint; ldone/xdone when the loop ran the load / exact answer's
callbacks.
"""

import os

if os.environ.get("ROUTE10_PROBE") and os.environ.get("SEMBLEND_ENABLED") == "1":
    import contextlib
    import json
    import threading
    import time

    import semblend_dynamo.pipeline as P
    import semblend_dynamo.router.catalog as C
    import semblend_dynamo.router.handler as H
    import semblend_dynamo.router.indexer as I
    import semblend_dynamo.span_aligner as S
    from semblend_dynamo import _native

    _out = open(  # noqa: SIM115 (open for the process's life)
        os.path.join(os.environ["ROUTE10_PROBE"], f"probe_{os.getpid()}.jsonl"), "a", buffering=1
    )
    _pc, _tt = time.perf_counter, time.thread_time
    _bg: list = []  # (name, thread, start, end, cpu)
    _cur: dict = {}

    def _mark(name):
        _cur[name] = (_pc(), _tt())

    def _timed(owner, attr, start, end):
        fn = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            _mark(start)
            try:
                return fn(*args, **kwargs)
            finally:
                _mark(end)

        setattr(owner, attr, wrapped)
        return wrapped

    def _background(owner, attr, name):
        fn = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            start, cpu = _pc(), _tt()
            try:
                return fn(*args, **kwargs)
            finally:
                _bg.append((name, threading.current_thread().name, start, _pc(), _tt() - cpu))

        setattr(owner, attr, wrapped)

    _parse = H.SemanticRouter.parse

    def parse(self, *args, **kwargs):
        _cur.clear()
        _mark("p0")
        return _parse(self, *args, **kwargs)

    H.SemanticRouter.parse = parse
    _timed(H.SemanticRouter, "_spans_during_exact", "s0", "s1")
    _timed(H.SemanticRouter, "_exact_may_win", "g0", "g1")
    _timed(C.DonorCatalog, "stored_together", "st0", "st1")
    _timed(P.DonorDiscovery, "find_spans", "f0", "f1")
    _timed(S.SpanAligner, "align", "a0", "a1")
    if hasattr(_native, "AlignCall"):  # one argument block per call (sched10's native core)
        _timed(_native.AlignCall, "run", "n0", "n1")
    else:
        _timed(_native, "align", "n0", "n1")

    def _when_done(future, name):
        with contextlib.suppress(AttributeError):
            future.add_done_callback(lambda _: _mark(name))
        return future

    _ask_exact, _ask_loads = H.SemanticRouter._ask_exact, H.SemanticRouter._ask_loads

    def ask_exact(self, routed):
        _mark("x0")
        try:
            return _when_done(_ask_exact(self, routed), "xdone")
        finally:
            _mark("x1")

    def ask_loads(self, routed):
        _mark("l0")
        return _when_done(_ask_loads(self, routed), "ldone")

    H.SemanticRouter._ask_exact, H.SemanticRouter._ask_loads = ask_exact, ask_loads
    _send_hint = H.SemanticRouter._send_hint

    async def send_hint(self, decision):
        _mark("h0")
        await _send_hint(self, decision)
        _mark("h1")
        line = {k: v for k, v in _cur.items() if isinstance(v, (tuple, list))}
        line["lat"] = decision.latency_us
        since = _cur["p0"][0] - 0.05 if "p0" in _cur else 0.0  # what ran from 50 ms before the request on
        line["bg"] = [b for b in _bg if b[3] > since]
        _bg.clear()
        _out.write(json.dumps(line) + "\n")

    H.SemanticRouter._send_hint = send_hint
    _background(P.DonorDiscovery, "embed_prompts", "embed")
    _background(H.SemanticRouter, "_add_donor", "add_donor")
    _background(I.PipelineIndexer, "_apply", "indexer_apply")
    _background(C.DonorCatalog, "apply_kv_events", "kv")
