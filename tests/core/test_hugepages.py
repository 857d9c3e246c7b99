"""Arrays for tables read at random: zeroed, shaped and typed as asked, 2 MiB-aligned from 2 MiB on."""

import numpy as np
import pytest

from semblend_dynamo import hugepages
from semblend_dynamo.span_aligner import SpanAligner


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((16,), np.uint8), ((1 << 21,), np.uint8), ((1 << 16, 8), np.uint64), ((3 << 18, 8), np.int32)],
)
def test_zeros_and_full_are_the_arrays_numpy_would_make(shape, dtype):
    zeros = hugepages.zeros(shape, dtype)
    assert zeros.shape == shape and zeros.dtype == dtype and zeros.flags.writeable and zeros.flags.c_contiguous
    assert not zeros.any()
    full = hugepages.full(shape, -1 if np.issubdtype(dtype, np.signedinteger) else 7, dtype)
    np.testing.assert_array_equal(full, np.full(shape, -1 if np.issubdtype(dtype, np.signedinteger) else 7, dtype))
    full[(0,) * len(shape)] = 3  # writeable, and its own memory
    assert zeros[(0,) * len(shape)] == 0


def test_a_large_array_starts_on_a_huge_page_boundary_and_a_small_one_is_numpys():
    large = hugepages.zeros((hugepages.HUGE_PAGE,), np.uint8)
    assert large.ctypes.data % hugepages.HUGE_PAGE == 0
    small = hugepages.zeros((1024,), np.uint8)
    assert small.base is None  # a plain numpy allocation below MIN_BYTES


def test_a_large_array_outlives_the_names_that_made_it():
    arrays = [hugepages.zeros((hugepages.HUGE_PAGE // 8,), np.uint64) for _ in range(3)]
    for i, a in enumerate(arrays):
        a[-1] = i
    assert [int(a[-1]) for a in arrays] == [0, 1, 2]


def _spans_and_arrays(native):
    rng = np.random.default_rng(3)
    aligner = SpanAligner(block_size=16, min_span_tokens=32, native=native)
    donors = [rng.integers(0, 50_000, 512) for _ in range(400)]
    for i, tokens in enumerate(donors):
        aligner.add_donor(f"d{i}", "ns", tokens)
    table = aligner._tables["ns"]
    target = np.concatenate([donors[7][:200], rng.integers(0, 50_000, 100), donors[300][64:400]])
    spans = aligner.align("ns", target)
    for i in range(0, 400, 3):  # releases rebuild nothing but clear bits and mark ids
        aligner.remove_donor(f"d{i}")
    return spans + aligner.align("ns", target), (table._bits, table.id_table.keys, table.id_table.ids)


@pytest.mark.parametrize("native", [False, None])
def test_the_chunk_filter_and_id_table_on_mapped_memory_find_the_same_spans(monkeypatch, native):
    expected, plain = _spans_and_arrays(native)
    monkeypatch.setattr(hugepages, "MIN_BYTES", 4096)
    spans, mapped = _spans_and_arrays(native)
    assert spans == expected and {s.donor_id for s in spans} >= {"d7", "d300"}
    assert all(a.base is None for a in plain if a.nbytes < hugepages.HUGE_PAGE)
    assert all(a.ctypes.data % hugepages.HUGE_PAGE == 0 for a in mapped)  # every table array was mapped
