"""Loading the per-version extension modules (planner, donor entries, load validation, unboxing) beside their source.

Each is built from one C file by :func:`semblend_dynamo._native.build.build_module` into ``<stem><extension
suffix>`` next to it, reports the digest of the source it was built from (``SOURCE_DIGEST``) and is refused when that
is not its current source's. Each has an environment variable that turns it off with 0 (its loader names it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from .build import BuildError, build_module, module_file_name, source_digest

__all__ = ["ExtensionModule", "disabled", "load", "module_path"]


def module_path(source: Path) -> Path:
    """This interpreter's module built from ``source`` (``planner.c`` -> ``_planner.cpython-312-....so``)."""
    return source.with_name(module_file_name("_" + source.stem))


def disabled(env: str) -> bool:
    """Whether ``env`` turns the module off (0, false, no, off)."""
    return os.environ.get(env, "1").strip().lower() in {"0", "false", "no", "off"}


def load(path: Path, source: Path, build_command: str) -> tuple[ModuleType | None, str]:
    """The module at ``path`` if it was built from ``source`` as it is now (else None), and why (not)."""
    if not path.exists():
        return None, f"{path.name} is not built ({build_command})"
    try:
        spec = importlib.util.spec_from_file_location("_" + source.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        digest = source_digest(source)
    except (ImportError, OSError) as exc:
        return None, f"{path.name} cannot be loaded: {exc}"
    if digest != getattr(module, "SOURCE_DIGEST", None):
        return None, f"{path.name} was built from another {source.name} ({build_command})"
    return module, f"loaded {path.name}"


@dataclass(frozen=True)
class ExtensionModule:
    """One per-version extension module: its C source, the variable that turns it off, its command (``python -m
    <command> build|status``), the function of it that callers use (``entry``) and the one that sets it up
    (``setup``: one module may serve two callers, each with its own entry and setup)."""

    source: Path
    env: str
    command: str
    entry: str
    setup: str = "setup"

    def module_path(self) -> Path:
        """This interpreter's module: it builds Python objects, so each version has its own."""
        return module_path(self.source)

    def disabled(self) -> bool:
        return disabled(self.env)

    def _switched_off(self) -> str | None:
        """Why :attr:`env` turns the module off (``NAME=value``), or None."""
        return f"{self.env}={os.environ.get(self.env)}" if self.disabled() else None

    def build(self, output: Path | None = None, compiler: str | None = None) -> Path:
        """Compile the source for this interpreter to ``output`` (default :meth:`module_path`), replaced atomically.

        ``compiler``: a command line (it may carry extra flags, e.g. ``cc -I<headers>``), default ``$CC`` or ``cc``.
        """
        return build_module(self.source, output or self.module_path(), compiler)

    def load(self, path: Path, setup_args: tuple[Any, ...]) -> tuple[Callable[..., Any] | None, str]:
        """The module's ``entry`` at ``path``, set up with ``setup_args`` (None if it cannot be used), and why."""
        module, reason = load(path, self.source, f"{self.command} build")
        if module is None:
            return None, reason
        getattr(module, self.setup)(*setup_args)
        return getattr(module, self.entry), reason

    def use(self, setup_args: tuple[Any, ...]) -> tuple[Callable[..., Any] | None, str]:
        """:meth:`load` of this interpreter's module unless :attr:`env` turns it off; the entry (or None) and why."""
        off = self._switched_off()
        return (None, off) if off is not None else self.load(self.module_path(), setup_args)

    def status(self) -> str:
        """Whether a process of this interpreter uses the module, and why not: what :meth:`use` decides, short of the
        caller's own set-up (so the command need not import the caller)."""
        off = self._switched_off()
        if off is not None:
            return f"python: {off}"
        module, reason = load(self.module_path(), self.source, f"{self.command} build")
        return f"{'native' if module is not None else 'python'}: {reason}"

    def main(self, argv: list[str] | None, description: str, status: Callable[[], str] | None = None) -> int:
        """``build [--output PATH] [--cc CMD]`` or ``status`` (``status()``, default :meth:`status`: whether this
        process uses it, and why not)."""
        parser = argparse.ArgumentParser(prog=self.command, description=description)
        commands = parser.add_subparsers(dest="command", required=True)
        make = commands.add_parser("build", help=f"compile {self.source.name} for this Python")
        make.add_argument("--output", type=Path, default=self.module_path(), help="default: %(default)s")
        make.add_argument("--cc", help="compiler command line (default: $CC or cc)")
        commands.add_parser("status", help="whether this process uses the module, and why not")
        args = parser.parse_args(argv)
        if args.command == "status":
            print(status() if status is not None else self.status())
            return 0
        try:
            print(self.build(args.output, args.cc))
        except BuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
