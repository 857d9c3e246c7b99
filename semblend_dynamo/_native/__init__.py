"""The compiled core of :meth:`semblend_dynamo.span_aligner.SpanAligner.align` (``span_aligner.c``), through ctypes.

The library is plain C (no Python API), built when the package is installed (``setup.py``) or by hand with
``python -m semblend_dynamo._native build``, and loaded once at import from this folder. It is not used, and the
aligner keeps its numpy path, when ``SEMBLEND_NATIVE_ALIGNER=0``, when the library is missing (no compiler at install
time), or when it was built from another version of ``span_aligner.c``; :data:`REASON` and one log line say why.

The functions run with the GIL held (``PyDLL``): they take microseconds, and releasing the GIL would let another
thread keep it for a whole switch interval. Arrays are passed by address; the caller keeps them alive and unchanged
for the call.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np

from semblend_dynamo._native.build import LIBRARY_NAME, source_digest

__all__ = ["ENV", "LIBRARY", "REASON", "Scan", "TableView", "disabled", "library_path"]

ENV = "SEMBLEND_NATIVE_ALIGNER"
log = logging.getLogger(__name__)

_P = ctypes.c_void_p
_I = ctypes.c_int64


class TableView(ctypes.Structure):
    """One namespace's chunk table as ``sa_table`` reads it: the addresses of its arrays and its shifts.

    Valid while the arrays it was made from are the table's (a table drops its view when it changes).
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
    )

    @classmethod
    def of(
        cls,
        bits: np.ndarray,
        filter_shift: int,
        keys: np.ndarray,
        ids: np.ndarray,
        id_shift: int,
        id_mask: int,
        single_serial: np.ndarray,
        single_offset: np.ndarray,
    ) -> TableView:
        view = cls(
            _address(bits),
            filter_shift,
            _address(keys),
            _address(ids),
            id_shift,
            id_mask,
            _address(single_serial),
            _address(single_offset),
        )
        view.address = ctypes.addressof(view)
        return view

    address: int


def _address(arr: np.ndarray) -> int:
    """The address of a C-contiguous array's first element."""
    return int(arr.__array_interface__["data"][0])


def library_path() -> Path:
    return Path(__file__).with_name(LIBRARY_NAME)


def disabled() -> bool:
    """Whether ``SEMBLEND_NATIVE_ALIGNER`` turns the compiled core off (0, false, no, off)."""
    return os.environ.get(ENV, "1").strip().lower() in {"0", "false", "no", "off"}


def _load() -> tuple[ctypes.PyDLL | None, str]:
    if disabled():
        return None, f"{ENV}={os.environ[ENV]}"
    path = library_path()
    if not path.exists():
        return None, f"{path.name} is not built (python -m semblend_dynamo._native build)"
    try:
        lib = ctypes.PyDLL(str(path))
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
    for name, argtypes, restype in (
        ("sa_hits", (_P, _P, _I, _I, _I, _P, _I, _P, _P, _P), None),
        ("sa_diagonals", (_P, _I, _P, _I, _I, _P), _I),
        ("sa_runs", (_P, _I, _I, _P, _I, _I, _I, _I, _P), _I),
    ):
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restype
    return lib, f"loaded {path.name} ({digest})"


LIBRARY, REASON = _load()
if LIBRARY is None:
    log.log(
        logging.INFO if disabled() else logging.WARNING, "span aligner: numpy path (native core not used: %s)", REASON
    )


class Scan:
    """One alignment's buffers for the three native steps, in one int64 array (one address lookup per request).

    ``hits()`` screens and looks up every window; ``diagonals()`` groups (with the hits the caller found on shared
    chunks), ranks and de-duplicates; ``runs()`` compares the chosen diagonals token by token.
    ``t`` (int64 or uint32 tokens; the donors ``runs()`` compares it with must be of its width) must stay alive and
    unchanged while the scan is used, and ``buffer`` (when given) used by no other scan.
    """

    def __init__(
        self,
        t: np.ndarray,
        anchor: int,
        block_size: int,
        min_span: int,
        max_diagonals: int,
        buffer: np.ndarray | None = None,
    ) -> None:
        self.t = t
        self.anchor = anchor
        self.block_size = block_size
        self.min_span = min_span
        self.max_diagonals = max_diagonals
        windows = t.size - anchor + 1
        self._hits_at = 2
        self._shared_at = self._hits_at + 3 * windows
        self._diagonals_at = self._shared_at + 2 * windows
        self._rows_at = self._diagonals_at + 4 * max_diagonals
        self._runs_at = self._rows_at + 5 * max_diagonals
        # A window holds at most (size + 1) // (min_span + 1) runs of min_span tokens.
        size = self._runs_at + 3 * max_diagonals * ((t.size + 1) // (min_span + 1))
        # Only the parts written are touched; ``buffer``, an earlier scan's, serves again when it is large enough.
        self.buffer = buffer if buffer is not None and buffer.size >= size else np.empty(size, dtype=np.int64)
        self._address = _address(self.buffer)
        self._t_address = _address(t)
        self.n_hits = 0

    def hits(self, table: TableView, allowed: np.ndarray | None) -> tuple[list[int], list[int]]:
        """Find the hits on chunks of one donor (kept for ``diagonals``; ``allowed``: sorted int64 serials, None for
        all); returns the positions and hashes of the hits on chunks several donors share, in target order."""
        assert LIBRARY is not None
        at = self._address
        LIBRARY.sa_hits(
            table.address,
            self._t_address,
            self.t.itemsize,
            self.t.size,
            self.anchor,
            None if allowed is None else _address(allowed),
            -1 if allowed is None else allowed.size,
            at + 8 * self._hits_at,
            at + 8 * self._shared_at,
            at,
        )
        self.n_hits, n_shared = self.buffer[:2].tolist()
        if not n_shared:  # nearly always: five array operations fewer
            return [], []
        shared = self.buffer[self._shared_at : self._shared_at + 2 * n_shared].view(np.uint64)
        return shared[0::2].tolist(), shared[1::2].tolist()

    def diagonals(self, extra: list[tuple[int, int, int]]) -> list[list[int]]:
        """Up to ``max_diagonals`` rows (serial, delta, first hit, last hit), as ``SpanAligner.align`` ranks them, of
        the hits found by ``hits()`` and the ``extra`` hits (serial, delta, position)."""
        assert LIBRARY is not None
        at = self._address
        rows = np.array(extra, dtype=np.int64) if extra else None
        n = LIBRARY.sa_diagonals(
            at + 8 * self._hits_at,
            self.n_hits,
            None if rows is None else _address(rows),
            len(extra),
            self.max_diagonals,
            at + 8 * self._diagonals_at,
        )
        if n < 0:
            raise MemoryError("span aligner: out of memory")
        found: list[list[int]] = self.buffer[self._diagonals_at : self._diagonals_at + 4 * n].reshape(-1, 4).tolist()
        return found

    def runs(self, rows: list[int]) -> list[list[int]]:
        """Rows (row index, target start, target end): the exact runs of at least ``min_span`` tokens, trimmed to
        target blocks, on each of the flattened rows (donor token address, donor length, delta, first hit, last hit),
        at most ``max_diagonals`` of them."""
        assert LIBRARY is not None
        self.buffer[self._rows_at : self._rows_at + len(rows)] = rows
        at = self._address
        n = LIBRARY.sa_runs(
            self._t_address,
            self.t.itemsize,
            self.t.size,
            at + 8 * self._rows_at,
            len(rows) // 5,
            self.block_size,
            self.anchor,
            self.min_span,
            at + 8 * self._runs_at,
        )
        found: list[list[int]] = self.buffer[self._runs_at : self._runs_at + 3 * n].reshape(-1, 3).tolist()
        return found
