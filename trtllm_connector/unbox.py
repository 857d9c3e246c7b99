"""The prompt list TensorRT-LLM hands the scheduler, as the u32 array every lookup reads, unboxed in C when built.

``get_tokens`` gives a Python list of ints; the connector converts it once per decision. :func:`u32_prompt` does it
with ``unbox.c`` (one pass reading each int's value; ~4x faster than ``array("I").fromlist``, which took ~34 µs of an
8K decision on the development VM) and otherwise with :func:`~semblend_dynamo.events.schemas.u32_tokens` (same result,
same errors). A binding that exposed the request's int32 vector as a buffer would hand that over instead: ``unbox.c``
copies it whole, with no int object per token.

A CPython extension (it reads int objects), built per Python version (``_unbox`` with this interpreter's extension
suffix, beside ``unbox.c``): at install (``setup.py``, optional: without a compiler or the Python headers the install
still succeeds) or with ``python -m trtllm_connector.unbox build [--cc CMD]``; ``... status`` says whether this
process uses it, and why not. ``SEMBLEND_NATIVE_UNBOX=0`` turns it off. One log line at import says when it is not
used; a module built from another ``unbox.c`` is not used.
"""

from __future__ import annotations

import array
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from semblend_dynamo._native.build import BuildError
from semblend_dynamo._native.modules import ExtensionModule
from semblend_dynamo.events.schemas import u32_tokens

__all__ = ["ENV", "REASON", "SOURCE", "BuildError", "Unboxer", "build", "load", "module_path", "u32_prompt", "use"]

MODULE = ExtensionModule(
    Path(__file__).with_name("unbox.c"), "SEMBLEND_NATIVE_UNBOX", "python -m trtllm_connector.unbox", "u32"
)
ENV = MODULE.env
SOURCE = MODULE.source
log = logging.getLogger(__name__)

Unboxer = Callable[[Sequence[int]], "array.array[int] | None"]
"""The module's ``u32(tokens)``: the array for an exact list of exact ints in [0, 2**32), else None (nothing raised)."""

module_path = MODULE.module_path
disabled = MODULE.disabled
build = MODULE.build
load = MODULE.load
use = MODULE.use

SETUP = (array.array("I", [0]),)
_U32, REASON = use(SETUP)
if _U32 is None:
    log.log(logging.INFO if disabled() else logging.WARNING, "prompt unboxing: array.fromlist (%s)", REASON)


def u32_prompt(tokens: Sequence[int], unboxer: Unboxer | None = _U32) -> array.array[int]:
    """``tokens`` as a native u32 array: :func:`u32_tokens`'s result and errors, in one C pass for a list of ints
    (``unboxer``: the module's ``u32``, this process's by default; None: :func:`u32_tokens` only), in one copy for a
    buffer of native 4-byte integers (the module's too)."""
    if unboxer is not None:
        out = unboxer(tokens)
        if out is not None:
            return out
    return u32_tokens(tokens)


def _status() -> str:
    return f"{'native' if _U32 is not None else 'fromlist'}: {REASON}"


def main(argv: list[str] | None = None) -> int:
    return MODULE.main(argv, __doc__.splitlines()[0], _status)


if __name__ == "__main__":
    sys.exit(main())
