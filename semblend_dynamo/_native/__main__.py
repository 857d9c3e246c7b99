"""``python -m semblend_dynamo._native build [--output PATH] [--cc CMD]``: compile the span aligner's library;
``python -m semblend_dynamo._native status``: say whether this process loads it, and why not."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from semblend_dynamo import _native
from semblend_dynamo._native.build import BuildError, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m semblend_dynamo._native", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="compile span_aligner.c into the library the package loads")
    make.add_argument("--output", type=Path, default=_native.library_path(), help="default: %(default)s")
    make.add_argument("--cc", help="compiler command line (default: $CC or cc)")
    commands.add_parser("status", help="whether the library is loaded, and why not")
    args = parser.parse_args(argv)
    if args.command == "status":
        print(f"{'native' if _native.LIBRARY is not None else 'numpy'}: {_native.REASON}")
        return 0
    try:
        print(build(args.output, args.cc))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
