"""The planner's accepting path compiled (``_native/planner.c``): :class:`~semblend_dynamo.planner.Planner` asks it first.

``accept(cfg, target_len, spans, similarity, device_prefix_tokens, approximate_donors, chain_head_tokens)`` returns the
:class:`~semblend_dynamo.planner.PlanDecision` the Python planner returns when it accepts (the same spans, counts and
float bits), and None for anything else: every decline, ``discovery_only``, inputs it does not take as they are; the
Python planner then decides, so it stays the reference and the whole behaviour. It runs on every scheduler decision
that found spans, where the Python planner's ~80 lines ran with the caches cold (14-33 µs on the quiet host).

It is a CPython extension (it builds the decision's objects), so it is built per Python version (``_planner`` with this
interpreter's extension suffix, beside ``_native/planner.c``): at install (``setup.py``, optional) or with
``python -m semblend_dynamo.native_planner build [--cc CMD]``; ``... status`` says whether this process uses it.
``SEMBLEND_NATIVE_PLANNER=0`` turns it off. A module built from another ``planner.c`` is not used.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._native import modules
from ._native.build import PLANNER_SOURCE, BuildError, build_module

__all__ = ["ENV", "SOURCE", "BuildError", "build", "load", "module_path"]

ENV = "SEMBLEND_NATIVE_PLANNER"
SOURCE = PLANNER_SOURCE
BUILD_COMMAND = "python -m semblend_dynamo.native_planner build"

Accept = Callable[..., Any]


def module_path() -> Path:
    """This interpreter's module: it builds Python objects, so each version has its own."""
    return modules.module_path(SOURCE)


def disabled() -> bool:
    return modules.disabled(ENV)


def build(output: Path | None = None, compiler: str | None = None) -> Path:
    """Compile ``planner.c`` for this interpreter to ``output`` (default :func:`module_path`), replaced atomically.

    ``compiler``: a command line (it may carry extra flags, e.g. ``cc -I<headers>``), default ``$CC`` or ``cc``.
    """
    return build_module(SOURCE, output or module_path(), compiler)


def load(path: Path, setup_args: tuple[Any, ...]) -> tuple[Accept | None, str]:
    """The module's ``accept`` at ``path``, set up with ``setup_args`` (None if it cannot be used), and why."""
    module, reason = modules.load(path, SOURCE, BUILD_COMMAND)
    if module is None:
        return None, reason
    module.setup(*setup_args)
    return module.accept, reason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m semblend_dynamo.native_planner", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="compile planner.c for this Python")
    make.add_argument("--output", type=Path, default=module_path(), help="default: %(default)s")
    make.add_argument("--cc", help="compiler command line (default: $CC or cc)")
    commands.add_parser("status", help="whether this process uses the module, and why not")
    args = parser.parse_args(argv)
    if args.command == "status":
        from semblend_dynamo import planner

        print(f"{'native' if planner.NATIVE_ACCEPT is not None else 'python'}: {planner.NATIVE_REASON}")
        return 0
    try:
        print(build(args.output, args.cc))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
