"""The collector kept off the donors a late replica's sync adds (``router/gc_freeze.py``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from semblend_dynamo.router.gc_freeze import SyncGcFreeze


class _Node:
    def __init__(self) -> None:
        self.peer: object = None


@pytest.fixture(autouse=True)
def _collector() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if was:  # as before the test, whatever the test left
        gc.enable()
    else:
        gc.disable()


def test_an_add_while_syncing_runs_without_the_collector_and_freezes_what_it_made() -> None:
    freeze = SyncGcFreeze()
    with freeze.adding(True):
        assert not gc.isenabled()
        made = [_Node() for _ in range(5000)]  # past gen0's threshold: a collection would have run
        counts = gc.get_count()
    assert gc.isenabled()
    assert counts[0] >= 5000  # nothing collected the young objects during the add
    assert freeze.frozen
    assert gc.get_freeze_count() >= len(made)
    assert gc.get_count()[0] < 100  # frozen: the young generation holds none of them
    freeze.thaw()
    assert not freeze.frozen and gc.get_freeze_count() == 0


def test_an_add_that_ends_the_sync_runs_as_any_code() -> None:
    freeze = SyncGcFreeze()
    with freeze.adding(False):
        assert gc.isenabled()
    assert not freeze.frozen and gc.get_freeze_count() == 0


def test_a_collector_switched_off_by_the_process_stays_off_and_nothing_is_frozen() -> None:
    gc.disable()
    freeze = SyncGcFreeze()
    with freeze.adding(True):
        pass
    assert not gc.isenabled()
    assert not freeze.frozen and gc.get_freeze_count() == 0


def test_an_add_that_fails_switches_the_collector_back_on() -> None:
    freeze = SyncGcFreeze()
    with pytest.raises(RuntimeError), freeze.adding(True):
        raise RuntimeError("add failed")
    assert gc.isenabled()
    assert freeze.frozen
    freeze.thaw()
