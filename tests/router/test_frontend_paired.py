"""The Frontend benchmark's paired added time: each sequential request's semantic minus exact-only router time."""

from __future__ import annotations

import pytest

from benchmarks.frontend_path.run import paired_added_ms


def test_pairs_each_request_with_its_own_exact_only_time() -> None:
    sem = [{"total_added": 1.0 + i / 100} for i in range(100)]
    exact = [{"total_added": 0.5} for _ in range(100)]
    exact[3] = {"total_added": 3.0}  # a slow exact-only request pairs with its own semantic one only
    p50, p99 = paired_added_ms(sem, exact)
    assert p50 == pytest.approx(0.5 + 0.495, abs=0.01)
    assert p99 == pytest.approx(0.5 + 0.98, abs=0.01)
    assert paired_added_ms(sem[:3], exact[:3]) == pytest.approx((0.51, 0.5198))  # 0.50, 0.51, 0.52


def test_requests_without_the_stage_or_a_partner_are_left_out() -> None:
    sem = [{"total_added": 2.0}, {"parse": 0.1}, {"total_added": 4.0}]
    exact = [{"total_added": 1.0}, {"total_added": 1.0}]
    assert paired_added_ms(sem, exact) == (1.0, 1.0)
    assert paired_added_ms([], exact) is None
