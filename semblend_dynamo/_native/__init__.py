"""The compiled core of :meth:`semblend_dynamo.span_aligner.SpanAligner.align` (``span_aligner.c``), through ctypes.

The library is plain C (no Python API), built when the package is installed (``setup.py``) or by hand with
``python -m semblend_dynamo._native build``, and loaded once at import from this folder. It is not used, and the
aligner keeps its numpy path, when ``SEMBLEND_NATIVE_ALIGNER=0``, when the library is missing (no compiler at install
time), or when it was built from another version of ``span_aligner.c``; :data:`REASON` and one log line say why.

One call, ``sa_align``, runs the whole alignment (tens of microseconds to a few hundred at 8K tokens and 100K donors),
by default without the GIL (``ctypes.CDLL``): another thread, such as Dynamo's runtime delivering the exact query's
answer, runs meanwhile instead of waiting for the search to end. ``SEMBLEND_ALIGNER_RELEASE_GIL=0`` keeps the GIL held
(``PyDLL``). Arrays are passed by address; the caller keeps them alive and unchanged for the call (the aligner's owner
serializes alignments with every table change).

The same library holds the router's block maps' bulk lookup and write (``um_locate``, ``um_assign``), which
:mod:`semblend_dynamo.router.u64map` calls through :func:`held_library` (with the GIL held, whatever
``SEMBLEND_NATIVE_ALIGNER`` says; ``SEMBLEND_NATIVE_MAP=0`` is their switch).
"""

from __future__ import annotations

import array
import ctypes
import logging
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from semblend_dynamo._native.build import LIBRARY_NAME, PLANNER_SOURCE, source_digest
from semblend_dynamo._native.modules import ExtensionModule
from semblend_dynamo._native.modules import disabled as switched_off

__all__ = [
    "ENV",
    "LIBRARY",
    "REASON",
    "RELEASE_ENV",
    "SA_ALIGN_ADDRESS",
    "SPANS",
    "TARGET_WORD",
    "AlignCall",
    "DonorsView",
    "TableView",
    "current_view",
    "disabled",
    "library_path",
    "release_gil",
    "work_size",
]

ENV = "SEMBLEND_NATIVE_ALIGNER"
RELEASE_ENV = "SEMBLEND_ALIGNER_RELEASE_GIL"
log = logging.getLogger(__name__)

_P = ctypes.c_void_p
_I = ctypes.c_int64


class TableView(ctypes.Structure):
    """One namespace's chunk table as ``sa_table`` reads it: the addresses of its arrays and its shifts.

    Valid while the arrays it was made from are the table's (:func:`current_view`).
    """

    _fields_ = (
        ("bits", _P),
        ("filter_shift", ctypes.c_uint64),
        ("keys", _P),
        ("ids", _P),
        ("id_shift", ctypes.c_uint64),
        ("id_mask", ctypes.c_uint64),
        ("single_serial", _P),
        ("single_offset", _P),
        ("shared_at", _P),
        ("shared_count", _P),
    )
    address: int
    made_from: tuple[weakref.ref[np.ndarray] | int, ...]

    @classmethod
    def of(cls, *fields: np.ndarray | int) -> TableView:
        """Arrays (by address) and integers in the order of ``_fields_``."""
        return _made(cls(*(array_address(f) if isinstance(f, np.ndarray) else f for f in fields)), fields)


class DonorsView(ctypes.Structure):
    """An aligner's donors as ``sa_donors`` reads them: serial -> slot (an id table), each slot's token address and
    length. Valid while the arrays it was made from are the aligner's (:func:`current_view`)."""

    _fields_ = (
        ("keys", _P),
        ("ids", _P),
        ("id_shift", ctypes.c_uint64),
        ("id_mask", ctypes.c_uint64),
        ("token_addresses", _P),  # not "address": that is the view's own, below
        ("token_lengths", _P),
    )
    address: int
    made_from: tuple[weakref.ref[np.ndarray] | int, ...]

    @classmethod
    def of(cls, *fields: np.ndarray | int) -> DonorsView:
        return _made(cls(*(array_address(f) if isinstance(f, np.ndarray) else f for f in fields)), fields)


View = TypeVar("View", TableView, DonorsView)


def _made(view: View, fields: tuple[np.ndarray | int, ...]) -> View:
    view.address = ctypes.addressof(view)
    # weakly: a replaced array is freed at once (a large table's), and a view of a freed one is never current
    view.made_from = tuple(weakref.ref(f) if isinstance(f, np.ndarray) else f for f in fields)
    return view


def current_view(view: View | None, kind: type[View], *fields: np.ndarray | int) -> View:
    """``view`` if it was made from these very arrays and integers, else a view of them: a table changed in place
    keeps its view (addresses cost microseconds each to read: a dozen per view)."""
    if view is not None and all(
        a() is b if isinstance(a, weakref.ref) else a == b for a, b in zip(view.made_from, fields, strict=True)
    ):
        return view
    return kind.of(*fields)


def array_address(arr: np.ndarray) -> int:
    """The address of a C-contiguous array's first element (through ctypes for a writable one: a few times quicker
    than numpy's ``__array_interface__`` or ``ctypes`` attributes)."""
    if arr.flags.writeable and arr.nbytes:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))  # type: ignore[arg-type]
    if not arr.flags.c_contiguous:
        raise ValueError("not C-contiguous")
    return int(arr.ctypes.data)


def library_path() -> Path:
    return Path(__file__).with_name(LIBRARY_NAME)


def disabled() -> bool:
    """Whether ``SEMBLEND_NATIVE_ALIGNER`` turns the compiled core off (0, false, no, off)."""
    return switched_off(ENV)


def release_gil() -> bool:
    """Whether ``sa_align`` runs without the GIL (``SEMBLEND_ALIGNER_RELEASE_GIL``, default on): other threads (Dynamo's
    runtime delivering an answer) run during the search. Off: through ``PyDLL``, holding it."""
    return not switched_off(RELEASE_ENV)


def _open(kind: type[ctypes.CDLL]) -> tuple[ctypes.CDLL | None, str]:
    """The library through ``kind`` (``CDLL`` or ``PyDLL``) if it is built from ``span_aligner.c`` as it is now."""
    path = library_path()
    if not path.exists():
        return None, f"{path.name} is not built (python -m semblend_dynamo._native build)"
    try:
        lib = kind(str(path))
        built_from = lib.sa_source_digest
    except (OSError, AttributeError) as exc:
        return None, f"{path.name} cannot be loaded: {exc}"
    built_from.restype = ctypes.c_char_p
    try:
        digest = source_digest()
    except OSError as exc:
        return None, f"cannot check {path.name} against its source: {exc}"
    if built_from() != digest.encode():
        return (
            None,
            f"{path.name} was built from another span_aligner.c (rebuild: python -m semblend_dynamo._native build)",
        )
    return lib, f"loaded {path.name} ({digest})"


def held_library() -> tuple[ctypes.CDLL | None, str]:
    """The library called with the GIL held (``PyDLL``), whether or not the aligner uses it (``SEMBLEND_NATIVE_ALIGNER``
    is the aligner's switch): the router's :class:`~semblend_dynamo.router.u64map.U64Map` calls its ``um_`` functions
    so. None if it is not built or was built from another ``span_aligner.c``, and why."""
    return _open(ctypes.PyDLL)


def _load() -> tuple[ctypes.CDLL | None, str]:
    if disabled():
        return None, f"{ENV}={os.environ[ENV]}"
    lib, reason = _open(ctypes.CDLL if release_gil() else ctypes.PyDLL)
    if lib is None:
        return None, reason
    for name, argtypes, restype in (
        ("sa_align", (_P,), _I),
        ("sa_work_size", (_I, _I, _I, _I, _I, _I), _I),
    ):
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restype
    return lib, reason[:-1] + (", GIL released)" if release_gil() else ")")


def _held(lib: ctypes.CDLL | None) -> Any:
    """``sa_align`` called with the GIL held, whichever way ``lib`` calls it."""
    if lib is None:
        return None
    if isinstance(lib, ctypes.PyDLL):
        return lib.sa_align
    function = ctypes.PyDLL(lib._name).sa_align
    function.argtypes = lib.sa_align.argtypes
    function.restype = lib.sa_align.restype
    return function


LIBRARY, REASON = _load()
_SA_ALIGN_HELD = _held(LIBRARY)
_RELEASES_GIL = LIBRARY is not None and not isinstance(LIBRARY, ctypes.PyDLL)
SA_ALIGN_ADDRESS: int = 0 if LIBRARY is None else ctypes.cast(LIBRARY.sa_align, ctypes.c_void_p).value or 0
"""``sa_align``'s address, for :meth:`AlignCall.spans` (0 when the library is not loaded)."""
if LIBRARY is None:
    log.log(
        logging.INFO if disabled() else logging.WARNING, "span aligner: numpy path (native core not used: %s)", REASON
    )


def work_size(n: int, anchor: int, min_span: int, max_diagonals: int, max_postings: int, max_spans: int) -> int:
    """The int64 words :func:`align`'s ``work`` must hold for a target of ``n >= anchor`` tokens."""
    assert LIBRARY is not None
    size: int = LIBRARY.sa_work_size(n, anchor, min_span, max_diagonals, max_postings, max_spans)
    return size


# sa_align's argument block: one int64 word each, in span_aligner.c's order (its ARG_ enum).
(
    _TABLE,
    _DONORS,
    _TARGET,
    _WIDTH,
    _N,
    _ANCHOR,
    _BLOCK_SIZE,
    _MIN_SPAN,
    _MAX_DIAGONALS,
    _MAX_POSTINGS,
    _MAX_SPANS,
    _ALLOWED,
    _N_ALLOWED,
    _WORK,
) = range(14)
TARGET_WORD = _TARGET
"""The argument block's word that holds the target's address (the planner module's ``spans`` writes it)."""
SPANS = ExtensionModule(
    PLANNER_SOURCE, "SEMBLEND_NATIVE_PLANNER", "python -m semblend_dynamo.native_planner", "spans", "setup_spans"
)
"""The planner's extension module (built per Python version, already loaded on every decision) also holds this
call's compiled form: its ``spans`` (set up with ``Span`` and :data:`TARGET_WORD`) fills the target's address, calls
``sa_align`` by its address and makes the rows ``Span`` objects (:meth:`AlignCall.spans`). The planner's variable
turns it off with the planner's path."""


class AlignCall:
    """One aligner's ``sa_align`` call: its arguments in one int64 block, filled in place per call (the fixed ones
    once), so ctypes converts one pointer instead of fourteen arguments."""

    def __init__(self, params: tuple[int, int, int, int, int]) -> None:
        """``params``: anchor, block size, min span, max diagonals, max postings."""
        self.args = array.array("q", bytes(8 * 14))
        self.address: int = self.args.buffer_info()[0]  # the block never grows: its address stays
        (
            self.args[_ANCHOR],
            self.args[_BLOCK_SIZE],
            self.args[_MIN_SPAN],
            self.args[_MAX_DIAGONALS],
            self.args[_MAX_POSTINGS],
        ) = params
        self.args[_N_ALLOWED] = -1
        self.work = 0

    def set_work(self, work: np.ndarray) -> None:
        """The int64 work buffer the calls write to (at least :func:`work_size` words for their targets)."""
        self.work = self.args[_WORK] = array_address(work)

    def run(
        self,
        table: TableView,
        donors: DonorsView,
        t: np.ndarray,
        max_spans: int,
        allowed: np.ndarray | None,
        *,
        hold_gil: bool = False,
    ) -> int:
        """``SpanAligner.align`` in one call: how many spans, whose rows (donor slot in ``donors``, donor start >= 0,
        target start, length > 0) are the work buffer's first words, in target order. ``t``: int64 or uint32 tokens
        (the donors' width), ``n >= anchor``; ``allowed``: sorted int64 serials, None for all. Everything passed, and
        the work buffer, stays alive and unchanged for the call (it may run without the GIL). ``hold_gil``: keep the
        GIL for this call even where the library lets it go (:func:`release_gil`)."""
        assert LIBRARY is not None and _SA_ALIGN_HELD is not None
        args = self.args
        args[_TABLE] = table.address
        args[_DONORS] = donors.address
        args[_TARGET] = array_address(t)
        args[_WIDTH] = t.itemsize
        args[_N] = t.size
        args[_MAX_SPANS] = max_spans
        if allowed is not None:
            args[_ALLOWED] = array_address(allowed)
            args[_N_ALLOWED] = allowed.size
        found: int = (_SA_ALIGN_HELD if hold_gil else LIBRARY.sa_align)(self.address)
        if allowed is not None:
            self._unrestrict()
        if found < 0:
            if found == -1:
                raise MemoryError("span aligner: out of memory")
            raise RuntimeError("span aligner: a diagonal's donor is missing from the donor table")
        return found

    def spans(
        self,
        build: Callable[[int, int, bool, int, list[str | None], np.ndarray], list[Any]],
        table: TableView,
        donors: DonorsView,
        t: np.ndarray,
        max_spans: int,
        allowed: np.ndarray | None,
        names: list[str | None],
        *,
        hold_gil: bool = False,
    ) -> list[Any]:
        """:meth:`run` and the spans of its rows in one compiled call (``build``: the planner module's ``spans``, set up
        with :data:`TARGET_WORD`, which puts the target's address in the block from its buffer, held through the call,
        calls ``sa_align`` by its address, with or without the GIL as :meth:`run` does, and makes a ``Span`` of each row
        with the donor id ``names[slot]``): no ctypes call, no ctypes object for the target's address (a few µs of a
        decision with the caches cold) and no Python loop over the rows."""
        args = self.args
        args[_TABLE] = table.address
        args[_DONORS] = donors.address
        args[_WIDTH] = t.itemsize
        args[_N] = t.size
        args[_MAX_SPANS] = max_spans
        if allowed is not None:
            args[_ALLOWED] = array_address(allowed)
            args[_N_ALLOWED] = allowed.size
        try:
            return build(SA_ALIGN_ADDRESS, self.address, hold_gil or not _RELEASES_GIL, self.work, names, t)
        finally:
            if allowed is not None:
                self._unrestrict()

    def _unrestrict(self) -> None:
        """Back to every donor; no address of a freed array left behind."""
        self.args[_ALLOWED] = 0
        self.args[_N_ALLOWED] = -1
