"""The prompt list TensorRT-LLM hands the scheduler, as the u32 array every lookup reads, unboxed in C when built.

``get_tokens`` gives a Python list of ints; the connector converts it once per decision. :func:`u32_prompt` does it
with ``unbox.c`` (a small C library reading each int's value; ~4x faster than ``array("I").fromlist``, which took
~34 µs of an 8K decision on the development VM) and otherwise with :func:`~semblend_dynamo.events.schemas.u32_tokens`
(same result, same errors). The library reads CPython's int objects, so it is built for one Python version
(``libunbox.<cache tag>.so`` beside this file) when the package is installed (``setup.py``, optional: without a
compiler or the Python headers the install still succeeds) or by hand with ``python -m trtllm_connector.unbox build``;
``python -m trtllm_connector.unbox status`` says whether this process uses it, and why not.
``SEMBLEND_NATIVE_UNBOX=0`` turns it off. One log line at import says when it is not used.
"""

from __future__ import annotations

import argparse
import array
import ctypes
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from semblend_dynamo._native.modules import disabled as switched_off
from semblend_dynamo.events.schemas import u32_tokens

from .unbox_build import BuildError, build, library_name, source_digest

__all__ = ["ENV", "REASON", "BuildError", "Unboxer", "build", "library_path", "load", "u32_prompt"]

ENV = "SEMBLEND_NATIVE_UNBOX"
log = logging.getLogger(__name__)


def library_path() -> Path:
    """This interpreter's library: it reads CPython's int objects, so each version has its own."""
    return Path(__file__).with_name(library_name())


def disabled() -> bool:
    return switched_off(ENV)


Unboxer = Callable[[list[int], int, int], int]


def load(path: Path) -> tuple[Unboxer | None, str]:
    """The library's function at ``path`` (None if it cannot be used) and why."""
    if not path.exists():
        return None, f"{path.name} is not built (python -m trtllm_connector.unbox build)"
    try:
        lib = ctypes.PyDLL(str(path))
        built_from = lib.ub_source_digest
        function = lib.ub_u32
    except (OSError, AttributeError) as exc:
        return None, f"{path.name} cannot be loaded: {exc}"
    built_from.restype = ctypes.c_char_p
    try:
        digest = source_digest()
    except OSError as exc:
        return None, f"cannot check {path.name} against its source: {exc}"
    if built_from() != digest.encode():
        return None, f"{path.name} was built from another unbox.c (rebuild: python -m trtllm_connector.unbox build)"
    function.argtypes = (ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)
    function.restype = ctypes.c_int
    return function, f"loaded {path.name}"


_UB_U32, REASON = (None, f"{ENV}={os.environ.get(ENV)}") if disabled() else load(library_path())
if _UB_U32 is None:
    log.log(logging.INFO if disabled() else logging.WARNING, "prompt unboxing: array.fromlist (%s)", REASON)
_ZERO = array.array("I", [0])


def u32_prompt(tokens: Sequence[int], unboxer: Unboxer | None = _UB_U32) -> array.array[int]:
    """``tokens`` as a native u32 array: :func:`u32_tokens`'s result and errors, in one C pass for a list of ints
    (``unboxer``: the library's function, this process's by default; None: :func:`u32_tokens` only)."""
    if unboxer is not None and type(tokens) is list:
        n = len(tokens)
        out = _ZERO * n
        if unboxer(tokens, out.buffer_info()[0], n) == 0:
            return out
    return u32_tokens(tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm_connector.unbox", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="compile unbox.c for this Python")
    make.add_argument("--output", type=Path, default=library_path(), help="default: %(default)s")
    make.add_argument("--cc", help="compiler command line (default: $CC or cc)")
    commands.add_parser("status", help="whether this process uses the library, and why not")
    args = parser.parse_args(argv)
    if args.command == "status":
        print(f"{'native' if _UB_U32 is not None else 'fromlist'}: {REASON}")
        return 0
    try:
        print(build(args.output, args.cc))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
