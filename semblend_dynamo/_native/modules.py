"""Loading the per-version extension modules (the planner's, the connector's load validation's) beside their source.

Each is built from one C file by :func:`semblend_dynamo._native.build.build_module` into ``<stem><extension
suffix>`` next to it, reports the digest of the source it was built from (``SOURCE_DIGEST``) and is refused when that
is not its current source's. Each has an environment variable that turns it off with 0 (its loader names it).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

from .build import module_file_name, source_digest

__all__ = ["disabled", "load", "module_path"]


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
