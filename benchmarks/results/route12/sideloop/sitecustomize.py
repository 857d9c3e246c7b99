"""Experiment (session 13, branch route12), not the router's code: Dynamo's answers completed on a second event loop.

Loaded by the semantic router (``SEMBLEND_ENABLED=1``) when this folder is on ``PYTHONPATH`` and ``ROUTE12_SIDELOOP=1``.
The load and exact queries are asked with a second, idle event loop (its own thread) set as the running loop for the
call, so Dynamo's pyo3 future belongs to that loop: the runtime hands the answer to it (``call_soon_threadsafe``) and
its thread completes the future, meanwhile the request's loop runs the span search. The request's loop then reads the
answer when it awaits it, without a loop turn when it is in already; otherwise it waits for it through its own loop
(a future set from the side thread). Same answers, same decisions; only where the answers are completed changes.
"""

import os

if os.environ.get("ROUTE12_SIDELOOP") == "1" and os.environ.get("SEMBLEND_ENABLED") == "1":
    import asyncio
    import threading

    import semblend_dynamo.router.handler as H

    _side = asyncio.new_event_loop()
    threading.Thread(target=_side.run_forever, name="route12-side-loop", daemon=True).start()

    class _Answer:
        """An answer completed on the side loop, awaitable on the request's loop."""

        __slots__ = ("_done", "_exc", "_lock", "_main", "_result", "_waiter")

        def __init__(self, main):
            self._done = False
            self._result = None
            self._exc = None
            self._waiter = None
            self._lock = threading.Lock()
            self._main = main

        def settle(self, fut):  # on the side loop (or the request's, when the answer was in before it was watched)
            with self._lock:
                if self._done:
                    return
                if fut.cancelled():
                    self._exc = asyncio.CancelledError()
                elif fut.exception() is not None:
                    self._exc = fut.exception()
                else:
                    self._result = fut.result()
                self._done = True
                waiter = self._waiter
            if waiter is not None:
                self._main.call_soon_threadsafe(_wake, waiter)

        def cancel(self):
            return False

        def add_done_callback(self, cb):  # _ask_loads adds _retrieve: nothing to retrieve here
            pass

        def __await__(self):
            if not self._done:
                with self._lock:
                    if not self._done:
                        self._waiter = self._main.create_future()
                if self._waiter is not None:
                    yield from self._waiter.__await__()
            if self._exc is not None:
                raise self._exc
            return self._result

    def _wake(waiter):
        if not waiter.done():
            waiter.set_result(None)

    def _on_side(call):
        main = asyncio.get_running_loop()
        answer = _Answer(main)
        asyncio.events._set_running_loop(_side)
        try:
            fut = call()
        finally:
            asyncio.events._set_running_loop(main)
        if asyncio.iscoroutine(fut):
            fut = asyncio.run_coroutine_threadsafe(fut, _side)
            fut.add_done_callback(answer.settle)
        else:  # the future can only complete on the side thread, with the GIL: watched here, checked after
            fut.add_done_callback(answer.settle)
            if fut.done():
                answer.settle(fut)
        return answer

    def _ask_exact(self, routed):
        return _on_side(
            lambda: self.kv_router.get_overlap_scores(
                routed.tokens, lora_name=routed.lora or None, cache_namespace=routed.cache_salt or None
            )
        )

    def _ask_loads(self, routed):
        return _on_side(lambda: self.kv_router.get_potential_loads(routed.tokens[: self.cfg.block_size]))

    H.SemanticRouter._ask_exact = _ask_exact
    H.SemanticRouter._ask_loads = _ask_loads
