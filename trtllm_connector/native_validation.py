""":func:`~trtllm_connector.validation.validate_load`'s passing path compiled (``validation.c``), asked first.

``load(target, num_computed, spans, registry, namespace_digest, tokens_per_block, exact_only, shift_supported,
tokens_checked)`` returns the :class:`~trtllm_connector.validation.ValidatedLoad` that ``validate_load`` returns when
every check passes (the same segments, the same donors from the registry's ``get``), and None otherwise: on any failed
check, and for input it does not take as it is, ``validate_load`` then decides and raises its ``Declined``. The
promised tokens are compared in place (no copies of the prompt's and the donor's runs), and the ~40 lines of Python
that ran cold on every promise (14-30 µs on the quiet host) become one call.

A CPython extension, built per Python version (``_validation`` with this interpreter's extension suffix, beside
``validation.c``): at install (``setup.py``, optional) or with ``python -m trtllm_connector.native_validation build
[--cc CMD]``; ``... status`` says whether this process uses it. ``SEMBLEND_NATIVE_VALIDATION=0`` turns it off.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from semblend_dynamo._native import modules
from semblend_dynamo._native.build import BuildError, build_module

__all__ = ["ENV", "SOURCE", "BuildError", "build", "load", "module_path"]

ENV = "SEMBLEND_NATIVE_VALIDATION"
SOURCE = Path(__file__).with_name("validation.c")
BUILD_COMMAND = "python -m trtllm_connector.native_validation build"

Load = Callable[..., Any]


def module_path() -> Path:
    """This interpreter's module: it builds Python objects, so each version has its own."""
    return modules.module_path(SOURCE)


def disabled() -> bool:
    return modules.disabled(ENV)


def build(output: Path | None = None, compiler: str | None = None) -> Path:
    """Compile ``validation.c`` for this interpreter to ``output`` (default :func:`module_path`), replaced atomically.

    ``compiler``: a command line (it may carry extra flags, e.g. ``cc -I<headers>``), default ``$CC`` or ``cc``.
    """
    return build_module(SOURCE, output or module_path(), compiler)


def load(path: Path, setup_args: tuple[Any, ...]) -> tuple[Load | None, str]:
    """The module's ``load`` at ``path``, set up with ``setup_args`` (None if it cannot be used), and why."""
    module, reason = modules.load(path, SOURCE, BUILD_COMMAND)
    if module is None:
        return None, reason
    module.setup(*setup_args)
    return module.load, reason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trtllm_connector.native_validation", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="compile validation.c for this Python")
    make.add_argument("--output", type=Path, default=module_path(), help="default: %(default)s")
    make.add_argument("--cc", help="compiler command line (default: $CC or cc)")
    commands.add_parser("status", help="whether this process uses the module, and why not")
    args = parser.parse_args(argv)
    if args.command == "status":
        from trtllm_connector import validation

        print(f"{'native' if validation.NATIVE_LOAD is not None else 'python'}: {validation.NATIVE_REASON}")
        return 0
    try:
        print(build(args.output, args.cc))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
