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

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from semblend_dynamo._native.build import BuildError
from semblend_dynamo._native.modules import ExtensionModule

__all__ = ["ENV", "SOURCE", "BuildError", "build", "load", "module_path", "use"]

MODULE = ExtensionModule(
    Path(__file__).with_name("validation.c"),
    "SEMBLEND_NATIVE_VALIDATION",
    "python -m trtllm_connector.native_validation",
    "load",
)
ENV = MODULE.env
SOURCE = MODULE.source
Load = Callable[..., Any]

module_path = MODULE.module_path
disabled = MODULE.disabled
build = MODULE.build
load = MODULE.load
use = MODULE.use


def main(argv: list[str] | None = None) -> int:
    return MODULE.main(argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
