"""The ``semblend-dynamo`` command.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` (with only the setting groups it uses)
and ``run(args) -> int``, and optionally ``EXAMPLES`` (the help's epilog);
modules are imported only when their subcommand is used, so ``replay`` needs no Dynamo runtime.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import typing
from collections.abc import Sequence

from semblend_dynamo import __version__
from semblend_dynamo.config import ConfigError

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("semblend_apps.replay.runner", "run the bundled workload in-process and print outcomes"),
    "router": ("semblend_dynamo.router.__main__", "run the SemBlend semantic router as a Dynamo component"),
    "up": ("semblend_apps.up", "start a local Dynamo graph: nats-server, Frontend, SemBlend router, mocker workers"),
    "config": ("semblend_apps.config_cmd", "validate and print the effective configuration"),
}


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (exit code 2), pointing at ``--help``."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="semblend-dynamo", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--version", action="version", version=f"semblend-dynamo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        if name != wanted:  # only the chosen subcommand's module is imported
            sub.add_parser(name, help=help_text)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(
            name,
            help=help_text,
            usage="%(prog)s [options]",
            description=help_text,
            epilog=getattr(mod, "EXAMPLES", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except ConfigError as exc:
        print(f"semblend-dynamo: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `semblend-dynamo replay | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
