import random
import threading
from math import isqrt

import numpy as np
import pytest

from semblend_dynamo.router import u64map
from semblend_dynamo.router.u64map import U64Map


@pytest.fixture(params=["default", "tiny levels"])
def level_bounds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The map's own bounds, or bounds so small that every level fills and merges many times over."""
    if request.param == "tiny levels":
        monkeypatch.setattr(u64map, "_MIN_DELTA", 2)
        monkeypatch.setattr(u64map, "_MAX_DELTA", 4)
        monkeypatch.setattr(u64map, "_MIN_OVERLAY", 8)
        monkeypatch.setattr(u64map, "_OVERLAY_PER_ROOT", 1)
        monkeypatch.setattr(u64map, "_BULK", 6)
        monkeypatch.setattr(u64map, "_MIN_STEP", 3)
        monkeypatch.setattr(u64map, "_MAX_STEP", 5)
        monkeypatch.setattr(u64map, "_DIR_MIN", 16)
        monkeypatch.setattr(u64map, "_DIR_RUN_BITS", 1)


@pytest.mark.usefixtures("level_bounds")
def test_the_map_behaves_as_a_dict_through_merges() -> None:
    rng = random.Random(7)
    keys = [rng.randrange(1 << 64) for _ in range(300)] + [0, (1 << 64) - 1]
    m, d = U64Map(), dict[int, int]()
    for step in range(20_000):
        op = rng.random()
        batch = rng.sample(keys, rng.randrange(1, 6) if rng.random() < 0.8 else rng.randrange(6, 90))
        if op < 0.3:
            key, value = batch[0], rng.randrange(1 << 64)
            m[key] = value
            d[key] = value
        elif op < 0.42:
            values = [rng.randrange(1 << 64) for _ in batch]
            m.set_many(batch, values)
            d.update(zip(batch, values, strict=True))
        elif op < 0.5:
            batch.sort()
            probe = np.array(batch, dtype=np.uint64)
            found, held = m.lookup(probe)
            assert found.tolist() == [k in d for k in batch]
            assert held.tolist() == [d.get(k, 0) for k in batch]
            values = [rng.randrange(1 << 64) for _ in batch]
            if rng.random() < 0.3:  # a change between the lookup and the assign: its positions are not reused
                m[batch[0]] = d[batch[0]] = rng.randrange(1 << 64)
            m.assign(probe, np.array(values, dtype=np.uint64))  # held keys and absent ones together
            d.update(zip(batch, values, strict=True))
        elif op < 0.62:
            assert m.pop(batch[0]) == d.pop(batch[0], None)
        elif op < 0.72:
            batch.append(batch[0])  # named twice: the second finds it gone
            assert m.pop_many(batch) == [d.pop(k, None) for k in batch]
        elif op < 0.98:
            assert m.get_many(batch) == [d.get(k) for k in batch]
            assert m.get(batch[0]) == d.get(batch[0]) and (batch[0] in m) == (batch[0] in d)
        else:
            assert dict(m.items()) == d
        assert len(m) == len(d), step
        assert view_is_current(m), step
    assert dict(m.items()) == d
    m.clear()
    assert len(m) == 0 and m.get(keys[0]) is None and list(m.items()) == []
    assert view_is_current(m)


def view_is_current(m: U64Map) -> bool:
    """Whether the compiled gate's view of the map (if it is used) is of the map's levels as they are now."""
    if u64map.NATIVE_LEVELS is None:
        return m._view is None
    levels = (
        m._over_keys,
        m._over_values,
        m._live,
        m._frozen_keys,
        m._frozen_values,
        m._frozen_live,
        m._keys,
        m._values,
    )
    view = m._view
    return (
        view is not None
        and all(held is level for held, level in zip(view[1:], levels, strict=True))
        and view[0] == u64map.NATIVE_LEVELS(*levels)[0]
    )


def test_bulk_inserts_keep_every_level_bounded() -> None:
    """Many bulk inserts (a late replica's sync) end in the base level, the overlay within its bound."""
    rng = np.random.default_rng(3)
    m = U64Map()
    keys = rng.choice(1 << 62, size=200_000, replace=False).astype(np.uint64)
    largest_overlay = 0.0
    for batch in np.array_split(keys, 200):
        m.assign(np.sort(batch), np.sort(batch) + np.uint64(1))
        bound = max(u64map._MIN_OVERLAY, u64map._OVERLAY_PER_ROOT * int(len(m._keys) ** 0.5))
        largest_overlay = max(largest_overlay, len(m._over_keys) / bound)
    assert len(m) == len(keys)
    found, values = m.lookup(keys)
    assert found.all() and (values == keys + np.uint64(1)).all()
    assert largest_overlay <= u64map._OVERFLOW  # past its bound only while a rewrite runs, and then within this


def test_single_lookups_compare_keys_as_u64_not_as_floats() -> None:
    """Keys a float64 cannot tell apart (2**62 and 2**62 + 1) are distinct keys, in every level and in a single get."""
    m = U64Map()
    keys = np.array([1 << 62, (1 << 62) + 1, (1 << 64) - 2, (1 << 64) - 1], dtype=np.uint64)
    m.set_many(keys.tolist(), keys.tolist())
    list(m.items())  # everything merged into the base level
    for key in keys.tolist():
        assert m.get(key) == key and key in m
    assert m.get((1 << 62) + 2) is None and ((1 << 62) + 2) not in m


def test_assign_writes_held_keys_in_place_and_inserts_the_others() -> None:
    """A late replica's postings land on keys the map holds: their values change where they are, no level grows."""
    m = U64Map()
    keys = np.arange(1, 20_001, dtype=np.uint64) * np.uint64(7)
    m.assign(keys, keys)
    m.items()  # everything merged into the base level
    assert len(m._over_keys) == 0
    held = keys[::3]
    m.assign(held, held + np.uint64(1))
    assert len(m._over_keys) == 0 and len(m) == len(keys)
    new = np.array([3, 5], dtype=np.uint64)
    m.assign(np.sort(np.concatenate((held[:100], new))), np.sort(np.concatenate((held[:100], new))))
    assert len(m) == len(keys) + 2
    assert m.get(int(held[200])) == int(held[200]) + 1 and m.get(int(held[1])) == int(held[1]) and m.get(5) == 5
    assert m.get(int(keys[1])) == int(keys[1])


def _rewriting_map(size: int, rng: np.random.Generator) -> tuple[U64Map, np.ndarray, dict[int, int]]:
    """A map of ``size`` keys, all in its base, and ``size`` more keys not in it (and the map as a dict)."""
    keys = rng.choice(1 << 62, size=2 * size, replace=False).astype(np.uint64)
    m = U64Map()
    m.assign(np.sort(keys[:size]), np.sort(keys[:size]))
    m.arrays()  # all in the base
    return m, keys, {int(k): int(k) for k in keys[:size]}


def test_the_base_is_rewritten_in_bounded_steps_while_every_lookup_stays_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full overlay is written into a new base a bounded slice per later merge, however many changes the merge
    brings (single changes merged 1,025 at a time, kv-event sized batches of 256): the overlay outgrows its bound
    meanwhile instead of the rest being written at once, and the old base serves every lookup until the new one
    replaces it."""
    monkeypatch.setattr(u64map, "_MIN_STEP", 500)
    monkeypatch.setattr(u64map, "_MAX_STEP", 1_000)  # 32 steps for a 32K base; a paced one would be 2.9K-11K
    monkeypatch.setattr(u64map, "_STEP_PER_CHANGE", 0)  # (at most _MAX_STEP whatever the merge's size)
    rng = np.random.default_rng(5)
    m, keys, expected = _rewriting_map(32_000, rng)
    bound = max(u64map._MIN_OVERLAY, u64map._OVERLAY_PER_ROOT * isqrt(32_000))
    slices: list[int] = []  # base entries each step wrote
    step = U64Map._rewrite_step

    def recorded_step(self: U64Map, entries: int) -> None:
        done = self._done[0]
        step(self, entries)
        slices.append((self._done[0] if len(self._frozen_keys) else 32_000) - done)

    monkeypatch.setattr(U64Map, "_rewrite_step", recorded_step)
    base, largest_overlay = m._keys, 0
    new = keys[32_000:].tolist()
    batches = iter(range(16_000, 32_000, 256))
    for at, key in enumerate(new[:16_000]):
        m[key] = key + 1  # single changes: merged into the overlay 1,025 at a time, or by the next batch
        expected[key] = key + 1
        if at % 256 == 0:  # and batches of 256
            first = next(batches)
            batch = new[first : first + 256]
            m.set_many(batch, [k + 2 for k in batch])
            expected.update((k, k + 2) for k in batch)
        largest_overlay = max(largest_overlay, len(m._over_keys))
        if m._keys is not base:
            break
    # steps of at most 1,000 base entries each wrote the new base while the old one served every lookup
    assert m._keys is not base and len(slices) > 32 and max(slices) <= 1_000 and sum(slices) == 32_000
    assert largest_overlay > bound  # the overlay outgrew its bound rather than the rewrite being written at once
    victims = keys[:10].tolist()
    for key in victims:
        del expected[key]
    assert m.pop_many(victims) == [int(k) for k in keys[:10]]
    probe = rng.permutation(keys)
    found, values = m.lookup(probe)
    assert found.tolist() == [int(k) in expected for k in probe.tolist()]
    assert values.tolist() == [expected.get(int(k), 0) for k in probe.tolist()]
    assert dict(m.items()) == expected and len(m) == len(expected)


def test_the_new_base_comes_with_its_directory_written_along_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrite writes the new base's directory a slice per step: no lookup builds one over the whole new base,
    and it is the directory a lookup would have built."""
    monkeypatch.setattr(u64map, "_MIN_STEP", 500)
    monkeypatch.setattr(u64map, "_MAX_STEP", 2_000)
    monkeypatch.setattr(u64map, "_DIR_MIN", 1024)
    rng = np.random.default_rng(6)
    m, keys, expected = _rewriting_map(20_000, rng)
    base = m._keys
    for key in keys[20_000:].tolist():
        m[key] = key
        expected[key] = key
        if m._keys is not base:
            break
    assert m._keys is not base and m._dir is not None and m._dir_steps > 0  # written with the base, not on demand
    written = (m._dir.copy(), m._dir_shift, m._dir_steps)
    m._build_dir()
    assert (written[0] == m._dir).all() and written[1:] == (m._dir_shift, m._dir_steps)
    probe = np.sort(rng.permutation(keys)[:5_000])
    found, values = m.lookup(probe)
    assert found.tolist() == [int(k) in expected for k in probe.tolist()]
    assert values.tolist() == [expected.get(int(k), 0) for k in probe.tolist()]


def test_assign_during_a_rewrite_leaves_the_rewrite_to_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bulk assign while the base is being rewritten (keys on every level, and new ones) does not write the rest
    of the rewrite at once, and every key reads as assigned."""
    monkeypatch.setattr(u64map, "_MIN_STEP", 500)
    monkeypatch.setattr(u64map, "_MAX_STEP", 1_000)
    rng = np.random.default_rng(8)
    m, keys, expected = _rewriting_map(20_000, rng)
    new = keys[20_000:].tolist()
    at = 0
    while not len(m._frozen_keys):  # single changes until the overlay is frozen and the rewrite starts
        m[new[at]] = expected[new[at]] = new[at]
        at += 1
    m.pop_many(keys[:5].tolist())  # deletions: in the overlay's dict, merged by the assign's lookup
    for key in keys[:5].tolist():
        del expected[key]
    frozen = m._frozen_keys
    probe = np.unique(np.concatenate((keys[:300], frozen[:200], np.array(new[at : at + 100], dtype=np.uint64))))
    values = probe + np.uint64(7)
    found, _ = m.lookup(probe)
    assert found.tolist() == [int(k) in expected for k in probe.tolist()]
    m.assign(probe, values)
    expected.update(zip(probe.tolist(), values.tolist(), strict=True))
    assert m._frozen_keys is frozen  # still being rewritten in steps
    assert len(m) == len(expected)
    assert m.get_many(probe.tolist()) == values.tolist()
    assert dict(m.items()) == expected


def test_settle_finishes_a_rewrite_the_changes_left_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes that stop mid-rewrite leave the map holding two bases (the old one and the part of the new one
    written): ``settle`` writes the rest a bounded slice per call, each call a change (for readers without a lock),
    every lookup right after each, and then the map holds one base."""
    monkeypatch.setattr(u64map, "_MIN_STEP", 500)
    monkeypatch.setattr(u64map, "_MAX_STEP", 1_000)
    rng = np.random.default_rng(9)
    m, keys, expected = _rewriting_map(30_000, rng)
    assert m.settle(1_000) == (0, 0)  # nothing in progress: nothing to write, and no change counted
    changes = m.quiet()
    new = keys[30_000:].tolist()
    at = 0
    while not m.rewriting:  # single changes until the overlay is frozen and the rewrite starts
        m[new[at]] = expected[new[at]] = new[at]
        at += 1
    assert m.quiet() != changes
    left = m.rewrite_left
    assert left > 1_000
    probe = rng.permutation(keys)
    calls = 0
    while m.rewriting:
        before = m.quiet()
        written, left_now = m.settle(700)
        calls += 1
        assert m.quiet() != before  # a change: a reader without the lock retries
        assert written > 0 and left_now == left - written and left_now == m.rewrite_left
        left = left_now
        found, values = m.lookup(np.sort(probe[:2_000]))
        assert values[found].tolist() == [expected[int(k)] for k in np.sort(probe[:2_000])[found].tolist()]
    assert left == 0 and calls >= 30_000 // 700
    assert m.settle(700) == (0, 0)
    assert dict(m.items()) == expected and len(m) == len(expected)
    assert not len(m._next_keys) and not len(m._frozen_keys)  # one base left: the old one and the frozen level freed


def test_a_single_lookup_keeps_the_gil_on_every_level() -> None:
    """``get`` lets no other thread run (numpy's ``searchsorted`` lets the GIL go): the router's exact-wins gate calls
    it just before the compiled span search, and a Dynamo answer waiting for the GIL is then handed over during that
    search, where it costs the loop nothing, instead of inside the gate, where the loop waits for it."""
    import sys

    m = U64Map()
    base = np.arange(1, 200_001, 2, dtype=np.uint64) << np.uint64(40)
    m.set_many(base.tolist(), list(range(len(base))))
    list(m.items())  # merged into the base level
    m.set_many([int(k) + 1 for k in base[:5000]], list(range(5000)))  # a batch: into the overlay
    m[7] = 70  # the dict of recent changes
    m.pop(int(base[10]))
    probes = [int(base[3]), int(base[10]), int(base[4000]) + 1, 7, 8, int(base[-1]) + 2, (1 << 64) - 1]
    expected = [3, None, 4000, 70, None, None, None]
    count = [0]
    stop = threading.Event()

    def other_thread() -> None:
        while not stop.is_set():
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)  # the other thread runs only where this one lets the GIL go
    runner = threading.Thread(target=other_thread)
    runner.start()
    try:
        while not count[0]:  # started
            pass
        advanced = []
        for _ in range(20):
            before = count[0]
            found = [m.get(key) for key in probes]
            advanced.append(count[0] != before)
            assert found == expected
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        runner.join()
    assert not any(advanced)


def test_quiet_tells_a_reader_on_another_thread_that_a_change_overlapped_it(monkeypatch: pytest.MonkeyPatch) -> None:
    m = U64Map()
    m.set_many([1, 2, 3], [10, 20, 30])
    before = m.quiet()
    assert before is not None and m.get(2) == 20 and m.quiet() == before  # reads change nothing
    entered, release = threading.Event(), threading.Event()
    overlay = U64Map._overlay

    def stalled_overlay(self: U64Map, *args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(10)
        return overlay(self, *args, **kwargs)

    monkeypatch.setattr(U64Map, "_overlay", stalled_overlay)
    writer = threading.Thread(target=m.set_many, args=(list(range(100, 200)), list(range(100))))
    writer.start()
    assert entered.wait(10)
    assert m.quiet() is None  # a change is running
    release.set()
    writer.join(10)
    after = m.quiet()
    assert after is not None and after != before and m.get(150) == 50


@pytest.mark.parametrize("spread", ["uniform", "bunched"])
def test_bulk_lookups_through_the_directory_find_what_binary_search_finds(
    spread: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large base is searched through its directory when its keys are uniform (block hashes), by binary search
    when they bunch into long runs (e.g. small sequential block ids); either way every probe gets its own answer."""
    monkeypatch.setattr(u64map, "_DIR_MIN", 1024)
    rng = np.random.default_rng(3)
    if spread == "uniform":
        keys = np.unique(rng.integers(1, (1 << 64) - 1, 5000, dtype=np.uint64))
    else:
        keys = np.arange(10, 5010, dtype=np.uint64) * np.uint64(3)
    m = U64Map()
    m.assign(keys, keys ^ np.uint64(0xFFFF))
    m.arrays()  # everything in the base
    beyond = np.array([0, (1 << 64) - 1], dtype=np.uint64)  # below and above every key
    probe = np.unique(np.concatenate((rng.choice(keys, 300), keys[:2], keys[-2:], keys[:50] + np.uint64(1), beyond)))
    found, values = m.lookup(probe)
    held = np.isin(probe, keys)
    assert (found == held).all() and (values == np.where(held, probe ^ np.uint64(0xFFFF), 0)).all()
    assert (m._dir_steps > 0) == (spread == "uniform")


needs_native = pytest.mark.skipif(u64map.NATIVE_LOCATE is None, reason=f"no compiled map: {u64map.NATIVE_REASON}")


def _numpy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(u64map, "NATIVE_LOCATE", None)
    monkeypatch.setattr(u64map, "NATIVE_ASSIGN", None)
    monkeypatch.setattr(u64map, "NATIVE_MERGE", None)


def _columns(rng: np.random.Generator, keys: np.ndarray, live: bool) -> tuple[np.ndarray, ...]:
    """Sorted ``keys`` with random values (and a live column, about a third dead, where ``live``)."""
    keys = np.sort(keys)
    values = rng.integers(0, 1 << 64, len(keys), dtype=np.uint64, endpoint=False)
    return (keys, values, rng.random(len(keys)) < 0.66) if live else (keys, values)


@needs_native
@pytest.mark.parametrize("with_live", [True, False], ids=["overlay", "base slice"])
@pytest.mark.parametrize("overlap", [True, False], ids=["shared keys", "distinct keys"])
@pytest.mark.parametrize("sizes", [(0, 0), (0, 1), (1, 0), (1, 1), (0, 7), (9, 0), (5, 17), (300, 3), (4000, 600)])
def test_the_compiled_merge_matches_numpys(sizes: tuple[int, int], overlap: bool, with_live: bool) -> None:
    """``um_merge`` writes what the numpy reference builds: the union in key order, a new entry replacing an old one
    of its key; into columns with a live flag the dead new entries too, into a base slice's (two columns) a dead entry
    only removes its key. It writes no further than the entries it returns (the rewrite writes into the new base)."""
    rng = np.random.default_rng(sum(sizes) + 7 * overlap + 3 * with_live)
    n_old, n_new = sizes
    for _ in range(20):
        pool = np.unique(rng.integers(1, (1 << 64) - 1, 2 * (n_old + n_new), dtype=np.uint64))
        pool = rng.permutation(np.concatenate((pool, np.array([0, (1 << 64) - 1], dtype=np.uint64))))  # the ends
        old_keys = pool[:n_old]
        new_keys = (
            rng.choice(old_keys, min(n_old, max(1, n_new // 2)), replace=False)
            if overlap and n_old and n_new
            else pool[:0]
        )
        new_keys = np.concatenate((new_keys, pool[n_old : n_old + n_new - len(new_keys)]))
        old = _columns(rng, old_keys, with_live)
        new = _columns(rng, new_keys, True)
        expected = u64map._merged(old, new)
        room = n_old + n_new
        out = tuple(np.full((room + 3) * c.itemsize, 5, dtype=np.uint8).view(c.dtype) for c in old)  # 5: unwritten
        written = u64map._merge_native(old, new, out)
        assert written == len(expected[0])
        for column, reference in zip(out, expected, strict=True):
            assert column[:written].tolist() == reference.tolist()
            assert (column[written:].view(np.uint8) == 5).all()


def test_the_merge_reference_replaces_and_drops_as_the_map_needs() -> None:
    """The numpy reference itself, on a hand-made case: old keys 1, 3, 5; new 2 (dead), 3 (live), 5 (dead)."""
    u64 = np.uint64
    old = (np.array([1, 3, 5], dtype=u64), np.array([10, 30, 50], dtype=u64), np.array([True, False, True]))
    new = (np.array([2, 3, 5], dtype=u64), np.array([20, 31, 0], dtype=u64), np.array([False, True, False]))
    keys, values, live = u64map._merged(old, new)
    assert keys.tolist() == [1, 2, 3, 5] and values.tolist() == [10, 20, 31, 0]
    assert live.tolist() == [True, False, True, False]
    keys, values = u64map._merged(old[:2], new)
    assert keys.tolist() == [1, 3] and values.tolist() == [10, 31]


@pytest.mark.parametrize("path", ["compiled", "numpy"])
def test_bulk_changes_through_many_rewrites_read_as_a_dict(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bulk assigns, set_many batches (new and held keys) and deletions, with small rewrite steps so that many
    rewrites run and overlap the changes: the map reads as a dict after each, on the compiled merges and on numpy's."""
    if path == "numpy":
        _numpy_path(monkeypatch)
    elif u64map.NATIVE_MERGE is None:
        pytest.skip(f"no compiled map: {u64map.NATIVE_REASON}")
    monkeypatch.setattr(u64map, "_MIN_OVERLAY", 512)
    monkeypatch.setattr(u64map, "_OVERLAY_PER_ROOT", 4)
    monkeypatch.setattr(u64map, "_MIN_STEP", 300)
    monkeypatch.setattr(u64map, "_MAX_STEP", 700)
    monkeypatch.setattr(u64map, "_DIR_MIN", 1024)
    rng = np.random.default_rng(21)
    pool = np.unique(rng.integers(0, 1 << 64, 60_000, dtype=np.uint64, endpoint=False))
    m, d = U64Map(), dict[int, int]()
    rewrites = 0
    for step in range(400):
        op = rng.random()
        batch = np.sort(rng.choice(pool, int(rng.integers(64, 600)), replace=False))
        values = rng.integers(0, 1 << 64, len(batch), dtype=np.uint64, endpoint=False)
        frozen = m._frozen_keys
        if op < 0.5:
            m.lookup(batch)
            m.assign(batch, values)
            d.update(zip(batch.tolist(), values.tolist(), strict=True))
        elif op < 0.75:
            m.set_many(batch.tolist(), values.tolist())
            d.update(zip(batch.tolist(), values.tolist(), strict=True))
        else:
            assert m.pop_many(batch.tolist()) == [d.pop(k, None) for k in batch.tolist()]
        rewrites += m._frozen_keys is not frozen and len(m._frozen_keys) > 0
        assert len(m) == len(d), step
        probe = rng.choice(pool, 300)
        found, held = m.lookup(probe)
        assert found.tolist() == [k in d for k in probe.tolist()], step
        assert held.tolist() == [d.get(k, 0) for k in probe.tolist()], step
        assert view_is_current(m), step
    assert rewrites > 10
    assert dict(m.items()) == d


def _state(m: U64Map) -> list[object]:
    """Every level's arrays (a rewrite's new base and directory as far as written), the dict's changes and the count:
    two maps driven alike must hold the same."""
    levels = (
        "_keys",
        "_values",
        "_over_keys",
        "_over_values",
        "_live",
        "_frozen_keys",
        "_frozen_values",
        "_frozen_live",
    )
    arrays = [getattr(m, name) for name in levels]
    arrays += [m._next_keys[: m._written], m._next_values[: m._written]]
    arrays += [a for a in (m._dir, None if m._next_dir is None else m._next_dir[: m._next_dir_at]) if a is not None]
    return [*(a.tolist() for a in arrays), dict(m._delta), set(m._gone), len(m), m._dir_steps, m._written, m._done]


@needs_native
@pytest.mark.usefixtures("level_bounds")
def test_the_compiled_lookup_and_assign_match_numpys_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two maps driven through the same changes, one with the compiled bulk lookup and write, one with numpy's, hold
    the same levels after every step (a rewrite in progress, deleted overlay keys, a base with and without its
    directory), and every bulk lookup of either path finds the same keys at the same places in both."""
    rng = np.random.default_rng(11)
    pool = np.unique(rng.integers(0, 1 << 64, 3000, dtype=np.uint64, endpoint=False))
    pool = np.concatenate((pool, np.array([0, (1 << 64) - 1], dtype=np.uint64)))
    native, reference = U64Map(), U64Map()
    for step in range(1500):
        op = rng.random()
        size = int(rng.integers(1, 8)) if rng.random() < 0.5 else int(rng.integers(60, 700))
        batch = np.sort(rng.choice(pool, size, replace=False))
        values = rng.integers(0, 1 << 64, size, dtype=np.uint64, endpoint=False)
        for m, numpy in ((native, False), (reference, True)):
            with monkeypatch.context() as patch:
                if numpy:
                    _numpy_path(patch)
                if op < 0.45:
                    m.lookup(batch)
                    m.assign(batch, values)
                elif op < 0.65:
                    m.set_many(batch.tolist(), values.tolist())
                elif op < 0.8:
                    m.pop_many(batch.tolist())
                else:
                    m.lookup(batch)
        assert _state(native) == _state(reference), step
        probe = rng.choice(pool, int(rng.integers(1, 400)))  # unsorted, repeats
        n_found, n_values, n_at = native._locate(probe)
        with monkeypatch.context() as patch:
            _numpy_path(patch)
            r_found, r_values, r_at = native._locate(probe)
        assert n_found.tolist() == r_found.tolist() and n_values.tolist() == r_values.tolist(), step
        for hit, at in (("over_hit", "over_at"), ("base_hit", "base_at")):
            mine, theirs = getattr(n_at, hit), getattr(r_at, hit)
            assert mine.tolist() == theirs.tolist()
            assert getattr(n_at, at)[mine].tolist() == getattr(r_at, at)[theirs].tolist()
    assert dict(native.items()) == dict(reference.items())


def test_without_the_compiled_map_lookups_assigns_and_merges_take_numpys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SEMBLEND_NATIVE_MAP=0`` turns the compiled path off (and says so); the numpy path does the same work."""
    monkeypatch.setenv(u64map.NATIVE_ENV, "0")
    locate, assign, merge, reason = u64map._load_native()
    assert locate is None and assign is None and merge is None and reason == f"{u64map.NATIVE_ENV}=0"
    _numpy_path(monkeypatch)
    m = U64Map()
    keys = np.arange(1, 5001, dtype=np.uint64) * np.uint64(11)
    m.assign(keys, keys)
    found, values = m.lookup(keys[::2])
    assert found.all() and (values == keys[::2]).all() and len(m) == len(keys)
