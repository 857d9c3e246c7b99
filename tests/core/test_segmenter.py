"""WindowSegmenter: coverage, overlap and the bounded sample, on hand-checked cases and random sizes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semblend_dynamo.segmenter import Window, WindowSegmenter


def spans(windows: list[Window]) -> list[tuple[int, int]]:
    return [(w.start, w.end) for w in windows]


def test_hand_checked_windows() -> None:
    seg = WindowSegmenter(window_tokens=256, overlap=32)
    assert spans(seg.windows(600)) == [(0, 256), (224, 480), (344, 600)]
    assert spans(seg.windows(480)) == [(0, 256), (224, 480)]
    assert spans(seg.windows(256)) == [(0, 256)]
    assert spans(seg.windows(10)) == [(0, 10)]


def test_empty_prompt_has_no_windows() -> None:
    assert WindowSegmenter(256, 32).windows(0) == []


def test_negative_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="n_tokens"):
        WindowSegmenter(256, 32).windows(-1)


@pytest.mark.parametrize(("window", "overlap"), [(0, 0), (8, 8), (8, -1), (8, 9)])
def test_bad_parameters_are_rejected(window: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        WindowSegmenter(window, overlap)


def test_window_model_rejects_empty_range() -> None:
    with pytest.raises(ValueError):
        Window(start=5, end=5)
    assert len(Window(start=3, end=10)) == 7


@settings(deadline=None)  # no wall-clock limits in unit tests (CI machines are shared)
@given(
    n=st.integers(min_value=1, max_value=20_000),
    window=st.integers(min_value=1, max_value=512),
    overlap_share=st.floats(min_value=0.0, max_value=0.99),
)
def test_windows_cover_the_prompt_with_the_promised_overlap(n: int, window: int, overlap_share: float) -> None:
    overlap = min(int(window * overlap_share), window - 1)
    ws = WindowSegmenter(window, overlap).windows(n)
    assert ws[0].start == 0 and ws[-1].end == n
    assert all(len(w) == min(window, n) for w in ws)
    for a, b in itertools.pairwise(ws):
        assert a.start < b.start
        assert a.end - b.start >= overlap  # consecutive windows share at least `overlap` tokens
        assert b.start <= a.end  # no gap
    covered = set()
    for w in ws:
        covered.update(range(w.start, w.end))
    assert covered == set(range(n))


def test_sample_keeps_first_and_last_and_is_even() -> None:
    ws = WindowSegmenter(256, 0).windows(256 * 32)  # 32 disjoint windows
    picked = WindowSegmenter.sample(ws, 4)
    assert [ws.index(w) for w in picked] == [0, 10, 21, 31]


@settings(deadline=None)
@given(n=st.integers(min_value=1, max_value=300), max_n=st.integers(min_value=1, max_value=64))
def test_sample_is_bounded_ordered_and_deterministic(n: int, max_n: int) -> None:
    ws = [Window(start=i, end=i + 1) for i in range(n)]
    picked = WindowSegmenter.sample(ws, max_n)
    assert len(picked) == min(n, max_n)
    assert picked == WindowSegmenter.sample(ws, max_n)
    assert picked == sorted(picked, key=lambda w: w.start) and len(set(picked)) == len(picked)
    assert picked[0] == ws[0]
    if max_n >= 2:
        assert picked[-1] == ws[-1]


def test_sample_of_nothing_and_bad_bound() -> None:
    assert WindowSegmenter.sample([], 4) == []
    with pytest.raises(ValueError, match="max_n"):
        WindowSegmenter.sample([Window(start=0, end=1)], 0)
