"""The planner's accepting path compiled (``_native/planner.c``): :class:`~semblend_dynamo.planner.Planner` asks it first.

``accept(cfg, target_len, spans, similarity, device_prefix_tokens, approximate_donors, chain_head_tokens)`` returns the
:class:`~semblend_dynamo.planner.PlanDecision` the Python planner returns when it accepts (the same spans, counts and
float bits) or declines ``exact_only_mode`` (the router's usual decline: spans found, none exact-equivalent), and None
for anything else: every other decline, ``discovery_only``, inputs it does not take as they are; the Python planner
then decides, so it stays the reference and the whole behaviour. It runs on every scheduler decision
that found spans, where the Python planner's ~80 lines ran with the caches cold (14-33 µs on the quiet host).

It is a CPython extension (it builds the decision's objects), so it is built per Python version (``_planner`` with this
interpreter's extension suffix, beside ``_native/planner.c``): at install (``setup.py``, optional) or with
``python -m semblend_dynamo.native_planner build [--cc CMD]``; ``... status`` says whether this process uses it.
``SEMBLEND_NATIVE_PLANNER=0`` turns it off. A module built from another ``planner.c`` is not used.

The module also holds the span aligner's compiled call (:data:`semblend_dynamo._native.SPANS`, ``spans(sa_align's
address, argument block, hold_gil, work address, donor ids, target)``): :class:`~semblend_dynamo.span_aligner.SpanAligner`
calls ``sa_align`` through it and gets its rows as ``Span`` objects, instead of a ctypes call and a Python loop over the
rows (with the caches cold on every decision, ~9 µs of the connector's decision on the development VM). The same
variable turns it off (the aligner then calls through ctypes).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from semblend_dynamo._native.build import PLANNER_SOURCE, BuildError
from semblend_dynamo._native.modules import ExtensionModule

__all__ = ["ENV", "SOURCE", "BuildError", "build", "load", "module_path", "use"]

MODULE = ExtensionModule(
    PLANNER_SOURCE, "SEMBLEND_NATIVE_PLANNER", "python -m semblend_dynamo.native_planner", "accept"
)
ENV = MODULE.env
SOURCE = MODULE.source
Accept = Callable[..., Any]

module_path = MODULE.module_path
disabled = MODULE.disabled
build = MODULE.build
load = MODULE.load
use = MODULE.use


def main(argv: list[str] | None = None) -> int:
    return MODULE.main(argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
