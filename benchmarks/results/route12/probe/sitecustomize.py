"""Diagnostic probe of the semantic router's span path (session 13, branch route12): route10's probe
(``benchmarks/results/route10/probe/sitecustomize.py``: the same environment, marks and JSON lines, run first), plus
when Dynamo's runtime hands an answer to the loop (``posts``: its ``call_soon_threadsafe`` calls from other threads),
every loop callback that ran between the end of the span path and the hint (``cbs``: name, start, end, thread CPU),
the semantic stage (m0/m1) and the end of ``decide`` (d1). ``timeline_report.py`` reads the lines. Example:

    ROUTE10_PROBE=<dir> PYTHONPATH=$PWD:$PWD/benchmarks/results/route12/probe \\
        python -m benchmarks.frontend_path.run --donors 20000 --requests 150
"""

import importlib.util
import os
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "route10_probe", Path(__file__).resolve().parents[2] / "route10" / "probe" / "sitecustomize.py"
)
assert _spec is not None and _spec.loader is not None
route10 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(route10)

if os.environ.get("ROUTE10_PROBE") and os.environ.get("SEMBLEND_ENABLED") == "1":
    # when another thread (Dynamo's runtime) hands an answer to the loop: call_soon_threadsafe's calls
    import asyncio.base_events as _BE
    import threading

    import semblend_dynamo.router.handler as H

    _cst = _BE.BaseEventLoop.call_soon_threadsafe
    _loop_thread: list = []

    def call_soon_threadsafe(self, callback, *args, **kwargs):
        if _loop_thread and threading.get_ident() != _loop_thread[0]:
            route10._cur.setdefault("posts", []).append(route10._pc())
        return _cst(self, callback, *args, **kwargs)

    _BE.BaseEventLoop.call_soon_threadsafe = call_soon_threadsafe
    _decide = H.SemanticRouter.decide

    async def decide(self, routed):
        if not _loop_thread:
            _loop_thread.append(threading.get_ident())
        try:
            return await _decide(self, routed)
        finally:
            route10._mark("d1")

    H.SemanticRouter.decide = decide
    # every loop callback that ran after the span path ended (s1) and before the hint was written: what
    # the loop did between the search and the exact answer's callback
    import asyncio.events as _EV

    _run = _EV.Handle._run

    def handle_run(self):
        if "s1" not in route10._cur or "h1" in route10._cur:
            return _run(self)
        start, cpu = route10._pc(), route10._tt()
        try:
            return _run(self)
        finally:
            route10._cur.setdefault("cbs", []).append(
                (repr(self._callback)[:80], start, route10._pc(), route10._tt() - cpu)
            )

    _EV.Handle._run = handle_run
    _semantic = H.SemanticRouter._semantic

    async def semantic(self, *args, **kwargs):
        route10._mark("m0")
        try:
            return await _semantic(self, *args, **kwargs)
        finally:
            route10._mark("m1")

    H.SemanticRouter._semantic = semantic
