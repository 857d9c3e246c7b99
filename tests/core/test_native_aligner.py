"""The span aligner's compiled core: how it is built, when it is loaded, and the fallback to numpy.

That it returns the same spans as numpy is tests/core/test_span_aligner_reference.py's and test_span_aligner.py's.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from semblend_dynamo import _native, native_planner, span_aligner
from semblend_dynamo._native import build
from semblend_dynamo._native.__main__ import main
from semblend_dynamo.span_aligner import Span, SpanAligner

needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc").split()[0]) is None, reason="no C compiler on PATH"
)


@needs_compiler
def test_the_library_is_plain_c_that_reports_its_source(tmp_path: Path) -> None:
    """Built by hand, it loads in any process (no libpython), names its source, and only its functions are exported."""
    out = build.build(tmp_path / "lib.so")
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind
    assert os.stat(out).st_mode & 0o044 == 0o044  # readable by other users (a service account)
    lib = ctypes.CDLL(str(out))
    lib.sa_source_digest.restype = ctypes.c_char_p
    assert lib.sa_source_digest() == build.source_digest().encode()
    if shutil.which("readelf"):
        dynamic = subprocess.run(["readelf", "-d", str(out)], capture_output=True, text=True, check=True).stdout
        needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
        assert not [name for name in needed if "python" in name], needed
        symbols = subprocess.run(["readelf", "--dyn-syms", "-W", str(out)], capture_output=True, text=True).stdout
        exported = {line.split()[-1] for line in symbols.splitlines() if " GLOBAL " in line and " UND " not in line}
        assert exported == {"sa_source_digest", "sa_align", "sa_work_size", "um_locate", "um_assign", "um_merge"}


@pytest.mark.parametrize("compiler", ["false", "/nonexistent/cc"])
def test_a_failed_build_is_one_line_and_leaves_nothing(tmp_path: Path, compiler: str) -> None:
    with pytest.raises(build.BuildError) as failed:
        build.build(tmp_path / "lib.so", compiler)
    assert compiler in str(failed.value) and "\n" not in str(failed.value)
    assert list(tmp_path.iterdir()) == []


def test_the_build_command_reports_a_failure_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--output", str(tmp_path / "lib.so"), "--cc", "false"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: false failed") and err.count("\n") == 1


def test_status_says_which_path_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 0
    path = "native" if _native.LIBRARY is not None else "numpy"
    assert capsys.readouterr().out == f"{path}: {_native.REASON}\n"


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(_native.ENV, value)
    assert _native._load() == (None, f"{_native.ENV}={value}")


def test_a_missing_or_unloadable_library_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(_native.ENV, raising=False)
    monkeypatch.setattr(_native, "library_path", lambda: tmp_path / build.LIBRARY_NAME)
    lib, reason = _native._load()
    assert lib is None and reason.startswith(f"{build.LIBRARY_NAME} is not built")
    (tmp_path / build.LIBRARY_NAME).write_bytes(b"not a shared library")
    lib, reason = _native._load()
    assert lib is None and reason.startswith(f"{build.LIBRARY_NAME} cannot be loaded")


@needs_compiler
def test_a_library_built_from_other_or_missing_source_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(_native.ENV, raising=False)
    monkeypatch.setattr(_native, "library_path", lambda: build.build(tmp_path / build.LIBRARY_NAME))
    assert _native._load()[0] is not None
    monkeypatch.setattr(_native, "source_digest", lambda: "0" * 16)
    lib, reason = _native._load()
    assert lib is None and "built from another span_aligner.c" in reason

    def source_gone() -> str:
        raise FileNotFoundError("span_aligner.c")

    monkeypatch.setattr(_native, "source_digest", source_gone)
    lib, reason = _native._load()
    assert lib is None and reason.startswith(f"cannot check {build.LIBRARY_NAME} against its source")


def test_asking_for_the_native_path_without_the_library_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_native, "LIBRARY", None)
    monkeypatch.setattr(_native, "REASON", "libspan_aligner.so is not built")
    with pytest.raises(ValueError, match=r"not available: libspan_aligner\.so is not built"):
        SpanAligner(block_size=16, min_span_tokens=32, native=True)
    assert SpanAligner(block_size=16, min_span_tokens=32).native is False


@needs_compiler
@pytest.mark.parametrize(("value", "held"), [(None, False), ("1", False), ("0", True), ("off", True)])
def test_the_search_releases_the_gil_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str | None, held: bool
) -> None:
    """By default the library is loaded as ``ctypes.CDLL`` (calls release the GIL); ``SEMBLEND_ALIGNER_RELEASE_GIL=0``
    loads it as ``PyDLL`` (calls keep it). The status line says which."""
    monkeypatch.delenv(_native.ENV, raising=False)
    if value is None:
        monkeypatch.delenv(_native.RELEASE_ENV, raising=False)
    else:
        monkeypatch.setenv(_native.RELEASE_ENV, value)
    monkeypatch.setattr(_native, "library_path", lambda: build.build(tmp_path / build.LIBRARY_NAME))
    lib, reason = _native._load()
    assert lib is not None and isinstance(lib, ctypes.PyDLL) == held
    assert reason.endswith(")") and ("GIL released" in reason) != held


@pytest.mark.skipif(_native.LIBRARY is None, reason="native core not loaded")
@pytest.mark.parametrize("in_c", [True, False], ids=["planner-module call", "ctypes call"])
def test_a_search_keeps_the_gil_when_its_owner_asks_and_finds_the_same_spans(in_c: bool) -> None:
    """``hold_gil`` is asked before each compiled search: True keeps every other Python thread waiting through it,
    whether the call goes through the planner module (``spans_in_c``) or ctypes."""
    if in_c and span_aligner.NATIVE_SPANS is None:
        pytest.skip(f"compiled spans not loaded: {span_aligner.NATIVE_SPANS_REASON}")
    import sys
    import threading

    import numpy as np

    rng = np.random.default_rng(3)
    donor = rng.integers(0, 1000, size=4096)
    # a long scan (~4 ms on the development VM): the other thread, woken when the GIL goes, runs within it even on a
    # busy machine
    target = np.concatenate((rng.integers(1000, 2000, size=2_000_000), donor))
    aligner = SpanAligner(32, 64, native=True)
    aligner.spans_in_c = in_c
    aligner.add_donor("d", "ns", donor)
    aligner.align("ns", target)  # its work buffer sized (that call lets the GIL go)
    holds: list[bool] = []
    count = [0]
    stop = threading.Event()

    def other_thread() -> None:
        while not stop.is_set():
            count[0] += 1

    def advanced(hold: bool, calls: int) -> list[bool]:
        """Whether the other thread advanced during each search; a released search stops at the first that let it
        (on a loaded machine the other thread may not get a CPU during every search)."""
        aligner.hold_gil = lambda: holds.append(hold) or hold
        out = []
        for _ in range(calls):
            before = count[0]
            spans = aligner.align("ns", target)
            out.append(count[0] != before)
            assert [(s.donor_id, s.donor_start, s.target_start, s.length) for s in spans] == [("d", 0, 2_000_000, 4096)]
            if out[-1] and not hold:
                break
        return out

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.2)  # the other thread runs only where this one lets the GIL go
    runner = threading.Thread(target=other_thread)
    runner.start()
    try:
        held = advanced(True, 5)
        released = advanced(False, 40) if _native.release_gil() else [True]
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        runner.join()
    assert holds == [True] * 5 + [False] * (len(released) if _native.release_gil() else 0)
    assert not any(held), held
    assert any(released), released


@pytest.mark.skipif(_native.LIBRARY is None, reason="native core not loaded")
def test_a_table_keeps_its_view_while_changed_in_place_and_gets_a_new_one_when_an_array_is_replaced() -> None:
    import weakref

    import numpy as np

    rng = np.random.default_rng(5)
    aligner = SpanAligner(32, 64, native=True)
    aligner.add_donor("a", "ns", rng.integers(0, 1000, size=256))
    table = aligner._tables["ns"]
    view = table.native_view()
    aligner.add_donor("b", "ns", rng.integers(0, 1000, size=256))  # written in place
    assert table.native_view() is view
    first_keys = weakref.ref(table.id_table.keys)
    for i in range(200):  # the id table and the per-key arrays grow: new arrays
        aligner.add_donor(f"c{i}", "ns", rng.integers(0, 1000, size=256))
    assert first_keys() is None  # a replaced array is freed at once: the view does not keep it
    grown = table.native_view()
    assert grown is not view
    assert grown.keys == _native.array_address(table.id_table.keys) and grown.single_serial == _native.array_address(
        table.single_serial
    )
    donor = rng.integers(0, 1000, size=512)
    aligner.add_donor("d", "ns", donor)
    [span] = aligner.align("ns", np.concatenate((rng.integers(1000, 2000, size=300), donor)))
    assert (span.donor_id, span.donor_start, span.target_start) == ("d", 20, 320)  # block-aligned on the target


@pytest.mark.skipif(_native.LIBRARY is None, reason="native core not loaded")
def test_admissions_and_releases_leave_the_views_current_so_a_search_reads_them_as_they_are() -> None:
    """A native aligner checks its table's and donor book's views when a donor comes or goes (admission time), not on
    every search: after each change, with the arrays growing under it, the views already hold the arrays' addresses."""
    import numpy as np

    rng = np.random.default_rng(6)
    aligner = SpanAligner(32, 64, native=True)
    book = aligner._book
    assert book is not None
    for i in range(150):
        aligner.add_donor(f"d{i}", "ns", rng.integers(0, 1000, size=256))
        if i % 4 == 3:
            aligner.remove_donor(f"d{i - 2}")
        table = aligner._tables["ns"]
        for owner in (table, book):
            assert not owner._changed and owner._view is not None
        assert table._view.keys == _native.array_address(table.id_table.keys)
        assert table._view.single_offset == _native.array_address(table.single_offset)
        assert book._view.token_addresses == _native.array_address(book.address)
        assert book._view.ids == _native.array_address(book.slots.ids)


@pytest.mark.skipif(_native.LIBRARY is None, reason="native core not loaded")
def test_a_search_restricted_to_candidates_leaves_the_next_one_unrestricted() -> None:
    """The call's argument block is reused: a search given candidates, then one without, considers every donor."""
    import numpy as np

    rng = np.random.default_rng(8)
    aligner = SpanAligner(32, 64, native=True)
    a, b = rng.integers(0, 1000, size=256), rng.integers(0, 1000, size=256)
    aligner.add_donor("a", "ns", a)
    aligner.add_donor("b", "ns", b)
    assert [s.donor_id for s in aligner.align("ns", b, candidates=["a"])] == []
    assert [s.donor_id for s in aligner.align("ns", b)] == ["b"]
    assert [s.donor_id for s in aligner.align("ns", b, candidates=["b"])] == ["b"]
    assert [s.donor_id for s in aligner.align("ns", a)] == ["a"]


needs_spans = pytest.mark.skipif(
    span_aligner.NATIVE_SPANS is None, reason=f"compiled spans not loaded: {span_aligner.NATIVE_SPANS_REASON}"
)


def _spans_aligners(seed: int) -> tuple[SpanAligner, SpanAligner, list[np.ndarray]]:
    """Two native aligners with the same donors (some released, their slots reused), one calling through the planner
    module (``spans_in_c``), one through ctypes; and targets made of the donors' pieces."""
    rng = np.random.default_rng(seed)
    pair = (SpanAligner(16, 32, native=True, tokens_u32=True), SpanAligner(16, 32, native=True, tokens_u32=True))
    pair[1].spans_in_c = False
    texts = {f"d{i}": rng.integers(0, 500, size=int(rng.integers(64, 600))).astype(np.uint32) for i in range(40)}
    for aligner in pair:
        for donor_id, tokens in texts.items():
            aligner.add_donor(donor_id, "ns", tokens)
        for i in range(0, 40, 3):
            aligner.remove_donor(f"d{i}")
        aligner.add_donor("late", "ns", texts["d0"])  # into a released slot
    targets = []
    for _ in range(30):
        pieces = [texts[f"d{int(i)}"][int(rng.integers(0, 40)) :] for i in rng.integers(0, 40, size=4)]
        pieces.append(rng.integers(0, 500, size=int(rng.integers(0, 100))).astype(np.uint32))
        targets.append(np.concatenate([p[int(rng.integers(0, 8)) :] for p in pieces]).astype(np.uint32))
    return pair[0], pair[1], targets


@needs_spans
@pytest.mark.parametrize("seed", range(3))
def test_the_compiled_call_gives_the_spans_the_ctypes_call_and_its_loop_give(seed: int) -> None:
    """The planner module's ``spans`` (``sa_align`` by its address, a ``Span`` per row made in C) and the ctypes call
    with ``_spans_of``: the same spans, of the same class, whatever the candidates and ``max_spans``."""
    in_c, through_ctypes, targets = _spans_aligners(seed)
    assert in_c.spans_in_c and not through_ctypes.spans_in_c
    rng = np.random.default_rng(seed)
    found = 0
    for target in targets:
        max_spans = int(rng.integers(1, 9))
        candidates = None if rng.random() < 0.5 else [f"d{int(i)}" for i in rng.integers(0, 40, size=6)]
        got = in_c.align("ns", target, candidates=candidates, max_spans=max_spans)
        expected = through_ctypes.align("ns", target, candidates=candidates, max_spans=max_spans)
        assert got == expected
        assert all(type(s) is Span and s.length > 0 and s.donor_start >= 0 for s in got)
        found += len(got)
    assert found >= 20


class _Negative:
    """A C function ``int64_t f(void *)`` (a ctypes callback) standing in for ``sa_align``: it returns ``value``."""

    def __init__(self, value: int) -> None:
        self.function = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(lambda _block: value)
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value


@needs_spans
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [(-1, MemoryError, "out of memory"), (-2, RuntimeError, "donor is missing from the donor table")],
)
@pytest.mark.parametrize("hold", [False, True], ids=["released", "held"])
def test_a_negative_result_raises_as_the_ctypes_call_does_and_unrestricts_the_block(
    monkeypatch: pytest.MonkeyPatch, value: int, error: type[Exception], message: str, hold: bool
) -> None:
    in_c, through_ctypes, targets = _spans_aligners(0)
    through_ctypes.align("ns", targets[0])  # its work buffer sized
    negative = _Negative(value)
    monkeypatch.setattr(_native, "SA_ALIGN_ADDRESS", negative.address)
    with pytest.raises(error, match=message):
        in_c.align("ns", targets[0], candidates=["d1"])
    assert in_c._call is not None
    assert (in_c._call.args[_native._ALLOWED], in_c._call.args[_native._N_ALLOWED]) == (0, -1)
    in_c.hold_gil = through_ctypes.hold_gil = lambda: hold
    with pytest.raises(error, match=message):
        in_c.align("ns", targets[0])
    # the ctypes call: the same error
    monkeypatch.setattr(_native, "LIBRARY", type("Library", (), {"sa_align": staticmethod(negative.function)})())
    monkeypatch.setattr(_native, "_SA_ALIGN_HELD", negative.function)
    with pytest.raises(error, match=message):
        through_ctypes.align("ns", targets[0], candidates=["d1"])


@needs_spans
def test_a_row_naming_no_slot_of_the_book_is_an_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    in_c, _, targets = _spans_aligners(1)
    assert in_c._call is not None
    in_c.align("ns", targets[0])  # its work buffer sized
    work = in_c._work

    def one_row(_block: int) -> int:
        work[:4] = (10_000, 0, 0, 16)
        return 1

    function = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(one_row)
    monkeypatch.setattr(_native, "SA_ALIGN_ADDRESS", ctypes.cast(function, ctypes.c_void_p).value)
    with pytest.raises(RuntimeError, match="donor slot 10000 is not in the book"):
        in_c.align("ns", targets[0])


@needs_spans
def test_the_compiled_spans_take_only_a_class_whose_fields_are_its_own_slots() -> None:
    from dataclasses import dataclass

    @dataclass
    class Plain:
        donor_id: str
        donor_start: int
        target_start: int
        length: int

    @dataclass(slots=True)
    class Fewer:
        donor_id: str
        donor_start: int

    for cls in (Plain, Fewer):
        with pytest.raises((TypeError, AttributeError)):
            _native.SPANS.load(native_planner.module_path(), (cls, _native.TARGET_WORD))
    assert _native.SPANS.load(native_planner.module_path(), (Span, _native.TARGET_WORD))[0] is span_aligner.NATIVE_SPANS


def test_the_planner_switch_turns_the_compiled_spans_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aligner's compiled call is the planner module's: the same source, command and switch."""
    assert (_native.SPANS.source, _native.SPANS.command) == (native_planner.SOURCE, native_planner.MODULE.command)
    monkeypatch.setenv(native_planner.ENV, "0")
    assert _native.SPANS.use((Span, _native.TARGET_WORD)) == (None, f"{native_planner.ENV}=0")
    monkeypatch.setattr(span_aligner, "NATIVE_SPANS", None)
    assert not SpanAligner(16, 32).spans_in_c


@needs_spans
def test_the_compiled_call_puts_the_targets_address_in_the_block_and_refuses_a_strided_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The target's address goes into the argument block from its buffer (held through the call); a target that is not
    C-contiguous is refused before any call."""
    in_c, _, targets = _spans_aligners(2)
    assert in_c._call is not None and in_c._book is not None
    in_c.align("ns", targets[0])  # its work buffer sized
    call = in_c._call
    seen: list[int] = []

    def read_block(_block: int) -> int:
        seen.append(call.args[_native._TARGET])
        return 0

    function = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(read_block)
    monkeypatch.setattr(_native, "SA_ALIGN_ADDRESS", ctypes.cast(function, ctypes.c_void_p).value)
    assert in_c.align("ns", targets[1]) == []
    assert seen == [targets[1].ctypes.data]
    strided = np.zeros(2 * targets[1].size, dtype=np.uint32)[::2]
    with pytest.raises((ValueError, BufferError)):
        call.spans(
            span_aligner.NATIVE_SPANS,  # type: ignore[arg-type]
            in_c._tables["ns"].native_view(),
            in_c._book.native_view(),
            strided,
            8,
            None,
            [],
        )
    assert len(seen) == 1
