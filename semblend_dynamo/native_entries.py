"""A sync page's donor entries built in C (``_native/entries.c``): :meth:`Residency._entries` asks it first.

``build(rows, ids, donor_ids, donor_keys, router_ids, worker_ids, keys, deployment, namespaces, num_tokens,
block_sizes, blobs, intern, share_int)`` returns the :class:`~semblend_dynamo.router.residency.DonorEntry` objects
that the Python path builds from the same columns of a page whose rows are all of one size (the same slot values, the
same shared strings and ints, the blobs copied from the rows of one array), without an ``__init__`` call or a list of
``bytes`` a donor: the late replica's sync builds one entry a donor (a million at 1M donors). The Python path stays the
reference, for pages of rows of other sizes and wherever the module is not used. It is a CPython extension (it builds
Python objects), built per Python version (``_entries`` with this interpreter's extension suffix, beside
``_native/entries.c``): at install (``setup.py``, optional) or with ``python -m semblend_dynamo.native_entries build
[--cc CMD]``; ``... status`` says whether this process uses it. ``SEMBLEND_NATIVE_ENTRIES=0`` turns it off. A module
built from another ``entries.c`` is not used.
"""

from __future__ import annotations

import sys

from semblend_dynamo._native.build import ENTRIES_SOURCE, BuildError
from semblend_dynamo._native.modules import ExtensionModule

__all__ = ["ENV", "SOURCE", "BuildError", "build", "load", "module_path", "use"]

MODULE = ExtensionModule(ENTRIES_SOURCE, "SEMBLEND_NATIVE_ENTRIES", "python -m semblend_dynamo.native_entries", "build")
ENV = MODULE.env
SOURCE = MODULE.source

module_path = MODULE.module_path
disabled = MODULE.disabled
build = MODULE.build
load = MODULE.load
use = MODULE.use


def main(argv: list[str] | None = None) -> int:
    return MODULE.main(argv, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
