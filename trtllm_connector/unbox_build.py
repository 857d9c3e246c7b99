"""Compile ``unbox.c`` into the prompt-unboxing library of one CPython version (``libunbox.<cache tag>.so``).

Standard library only: ``setup.py`` loads this file by path inside pip's isolated build environment, where the
package's dependencies are not installed. The library uses the Python C API (it reads int objects), so unlike the
span aligner's it is built for the interpreter that builds it; the loader (:mod:`trtllm_connector.unbox`) looks for
the running interpreter's and falls back to ``array.fromlist`` without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("unbox.c")


def _load_native_build() -> ModuleType:
    """The span aligner's build module (the same compile step and flags), loaded by path as ``setup.py`` loads this
    one: both packages sit side by side in the source tree and once installed."""
    path = Path(__file__).resolve().parent.parent / "semblend_dynamo" / "_native" / "build.py"
    spec = importlib.util.spec_from_file_location("_semblend_native_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_native_build = _load_native_build()
BuildError = _native_build.BuildError
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
    include = sysconfig.get_paths()["include"]
    return _native_build.compile_library(
        SOURCE, output, [f"-I{include}", f'-DUB_SOURCE_DIGEST="{source_digest()}"'], compiler
    )
