"""The span aligner's compiled core (semblend_dynamo/_native): a plain C shared library, not a Python extension; and
extension modules built for the installing Python (they use its C API): the connector's prompt unboxing
(trtllm_connector/unbox.c), the planner's accepting path (semblend_dynamo/_native/planner.c), the sync's donor entries
(semblend_dynamo/_native/entries.c) and validate_load's passing path (trtllm_connector/validation.c).

Everything else is in pyproject.toml. All are optional: without a working C compiler (or, for the modules, the Python
headers) the install still succeeds (setuptools prints why), the aligner uses its numpy path, the connector
``array.fromlist`` and the planner, the entries and validation their Python code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

_spec = importlib.util.spec_from_file_location(
    "_native_build", Path(__file__).parent / "semblend_dynamo/_native/build.py"
)
assert _spec is not None and _spec.loader is not None
native_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native_build)
UNBOX = "trtllm_connector._unbox"
PLANNER = "semblend_dynamo._native._planner"
ENTRIES = "semblend_dynamo._native._entries"
VALIDATION = "trtllm_connector._validation"
MODULES = {
    UNBOX: Path(__file__).parent / "trtllm_connector/unbox.c",
    PLANNER: native_build.PLANNER_SOURCE,
    ENTRIES: native_build.ENTRIES_SOURCE,
    VALIDATION: Path(__file__).parent / "trtllm_connector/validation.c",
}


class BuildNativeLibrary(build_ext):
    """Builds the library with ``native_build.build`` (the same command as ``python -m semblend_dynamo._native
    build``) under its plain name: no ABI tag, because it does not depend on the Python version; and each module with
    ``native_build.build_module`` (the same as its ``python -m ... build``) under this Python's extension suffix."""

    def get_ext_filename(self, fullname: str) -> str:
        package = fullname.rpartition(".")[0]
        # Called with the full dotted name and with its last part alone (get_ext_fullpath).
        last = fullname.rpartition(".")[2]
        module = last in {m.rpartition(".")[2] for m in MODULES}
        name = native_build.module_file_name(last) if module else native_build.LIBRARY_NAME
        return str(Path(*package.split(".")) / name)

    def build_extension(self, ext: Extension) -> None:
        if ext.name in MODULES:
            try:
                native_build.build_module(MODULES[ext.name], Path(self.get_ext_fullpath(ext.name)))
            except native_build.BuildError as exc:
                raise CompileError(f"{exc}; {ext.name} is not used (its Python code decides)") from exc
            return
        try:
            native_build.build(Path(self.get_ext_fullpath(ext.name)))
        except native_build.BuildError as exc:
            raise CompileError(f"{exc}; the span aligner will use its numpy path") from exc


class PlatformWheel(bdist_wheel):
    """Tagged ``py3-none-<platform>``: the library suits every Python 3 on this platform (ctypes, no Python API)."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", super().get_tag()[2]


setup(
    ext_modules=[
        Extension("semblend_dynamo._native.span_aligner", ["semblend_dynamo/_native/span_aligner.c"], optional=True),
        Extension(UNBOX, ["trtllm_connector/unbox.c"], optional=True),
        Extension(PLANNER, ["semblend_dynamo/_native/planner.c"], optional=True),
        Extension(ENTRIES, ["semblend_dynamo/_native/entries.c"], optional=True),
        Extension(VALIDATION, ["trtllm_connector/validation.c"], optional=True),
    ],
    cmdclass={"build_ext": BuildNativeLibrary, "bdist_wheel": PlatformWheel},
)
