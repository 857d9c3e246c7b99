"""Session 16 experiment (pin16): each router's event-loop thread on a CPU of its own.

Loaded as ``sitecustomize`` (this folder on PYTHONPATH) with ``PIN16=1``; acts only in a router process of the
Frontend benchmark (``SEMBLEND_ROUTER_NAMESPACE`` sem or exact). A daemon thread pins the main thread (the router's
event loop) to CPU 0 (semantic router) or CPU 1 (exact-only router) and every other thread of the process to CPUs 2 and
up, again every second (a thread inherits its creator's CPUs). Run the whole benchmark under ``taskset -c 2-N`` so
nothing else is scheduled on CPUs 0 and 1: a deployment that gives the router's loop a core of its own.
"""

import contextlib
import os
import sys
import threading
import time

_ROLE = os.environ.get("SEMBLEND_ROUTER_NAMESPACE")


def _keep(main: int, cpu: int, others: set[int]) -> None:
    said = False
    while True:
        try:
            os.sched_setaffinity(main, {cpu})
            for tid in os.listdir("/proc/self/task"):
                if int(tid) != main:
                    with contextlib.suppress(OSError):  # the thread ended meanwhile
                        os.sched_setaffinity(int(tid), others)
        except OSError as exc:
            print(f"pin16: not pinned ({exc})", file=sys.stderr, flush=True)
            return
        if not said:
            print(f"pin16: {_ROLE} router's loop thread {main} on CPU {cpu}", file=sys.stderr, flush=True)
            said = True
        time.sleep(1.0)


if os.environ.get("PIN16") == "1" and _ROLE in ("sem", "exact"):
    threading.Thread(
        target=_keep,
        args=(threading.get_native_id(), 0 if _ROLE == "sem" else 1, set(range(2, os.cpu_count() or 3))),
        daemon=True,
    ).start()
