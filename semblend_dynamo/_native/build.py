"""Compile ``span_aligner.c`` into a plain shared library (no Python API, no libpython: any CPython can load it), and
extension modules for the building Python (the planner's, :mod:`semblend_dynamo.native_planner`, the connector's
load validation's, :mod:`trtllm_connector.native_validation`, and its prompt unboxing's, :mod:`trtllm_connector.unbox`).

Standard library only: ``setup.py`` loads this file by path inside pip's isolated build environment, where the
package's dependencies are not installed.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shlex
import subprocess
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

SOURCE = Path(__file__).with_name("span_aligner.c")
PLANNER_SOURCE = Path(__file__).with_name("planner.c")
ENTRIES_SOURCE = Path(__file__).with_name("entries.c")
LIBRARY_NAME = "libspan_aligner.so"
# Portable x86_64/aarch64 code (no -march=native): the library may be copied to another Linux host.
CFLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror")


class BuildError(RuntimeError):
    """The library could not be compiled; the message says why in one line."""


def source_digest(source: Path = SOURCE) -> str:
    """What the library reports from ``sa_source_digest()``: the loader refuses a library built from other code."""
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def build(output: Path, compiler: str | None = None) -> Path:
    """Compile the library to ``output`` (replaced atomically: a process that loaded the old one keeps it).

    ``compiler``: a command line, default ``$CC`` or ``cc``.
    """
    return compile_library(SOURCE, output, [f'-DSA_SOURCE_DIGEST="{source_digest()}"'], compiler)


def module_file_name(stem: str) -> str:
    """An extension module's file name for this interpreter (its extension suffix: built per Python version)."""
    return stem + importlib.machinery.EXTENSION_SUFFIXES[0]


def build_module(source: Path, output: Path, compiler: str | None = None) -> Path:
    """Compile ``source``, a CPython extension module, for this interpreter to ``output`` (replaced atomically).

    The module's ``SOURCE_DIGEST`` is :func:`source_digest` of ``source`` (its loader refuses a module built from other
    code). Floating-point contraction is off: a compiled decision must round as Python's operations do.
    """
    include = sysconfig.get_paths()["include"]
    flags = [f"-I{include}", "-ffp-contract=off", f'-DMODULE_SOURCE_DIGEST="{source_digest(source)}"']
    return compile_library(source, output, flags, compiler)


def compile_library(source: Path, output: Path, flags: Sequence[str], compiler: str | None = None) -> Path:
    """Compile one C file with :data:`CFLAGS` and ``flags`` into the shared library ``output``, replaced atomically.

    ``compiler``: a command line (it may carry extra flags, e.g. ``cc -I<headers>``), default ``$CC`` or ``cc``.
    """
    command = shlex.split(compiler or os.environ.get("CC") or "cc")
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=output.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [*command, *CFLAGS, *flags, "-o", tmp, str(source)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[0]
            raise BuildError(f"{shlex.join(command)} failed: {detail}")
        os.chmod(tmp, 0o755)  # mkstemp's 0600 would hide it from other users
        os.replace(tmp, output)
    except OSError as exc:
        raise BuildError(f"{shlex.join(command)}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return output
