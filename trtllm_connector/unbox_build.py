"""Compile ``unbox.c`` into the prompt-unboxing library of one CPython version (``libunbox.<cache tag>.so``).

Standard library only: ``setup.py`` loads this file by path inside pip's isolated build environment, where the
package's dependencies are not installed. The library uses the Python C API (it reads int objects), so unlike the
span aligner's it is built for the interpreter that builds it; the loader (:mod:`trtllm_connector.unbox`) looks for
the running interpreter's and falls back to ``array.fromlist`` without it.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("unbox.c")
CFLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror")


class BuildError(RuntimeError):
    """The library could not be compiled; the message says why in one line."""


def library_name(cache_tag: str | None = None) -> str:
    """The library's file name for an interpreter (default: this one), e.g. ``libunbox.cpython-312.so``."""
    return f"libunbox.{cache_tag or sys.implementation.cache_tag}.so"


def source_digest(source: Path = SOURCE) -> str:
    """What the library reports from ``ub_source_digest()``: the loader refuses a library built from other code."""
    return hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def build(output: Path, compiler: str | None = None) -> Path:
    """Compile the library for this interpreter to ``output`` (replaced atomically).

    ``compiler``: a command line (it may carry extra flags, e.g. ``cc -I<headers>``), default ``$CC`` or ``cc``.
    """
    command = shlex.split(compiler or os.environ.get("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".unbox-", suffix=".so", dir=output.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [*command, *CFLAGS, f"-I{include}", f'-DUB_SOURCE_DIGEST="{source_digest()}"', "-o", tmp, str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
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
