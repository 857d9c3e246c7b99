import random

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
        monkeypatch.setattr(u64map, "_STEPS", 4)
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
    assert dict(m.items()) == d
    m.clear()
    assert len(m) == 0 and m.get(keys[0]) is None and list(m.items()) == []


def test_bulk_inserts_keep_every_level_bounded() -> None:
    """Many bulk inserts (a late replica's sync) end in the base level, the overlay within its bound."""
    rng = np.random.default_rng(3)
    m = U64Map()
    keys = rng.choice(1 << 62, size=200_000, replace=False).astype(np.uint64)
    for batch in np.array_split(keys, 200):
        m.assign(np.sort(batch), np.sort(batch) + np.uint64(1))
    assert len(m) == len(keys)
    found, values = m.lookup(keys)
    assert found.all() and (values == keys + np.uint64(1)).all()
    assert len(m._over_keys) <= max(u64map._MIN_OVERLAY, u64map._OVERLAY_PER_ROOT * int(len(m._keys) ** 0.5))


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


def test_the_base_is_rewritten_in_bounded_steps_while_every_lookup_stays_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full overlay is written into a new base a slice per later merge: no single change copies the whole base."""
    monkeypatch.setattr(u64map, "_MIN_STEP", 1_000)
    monkeypatch.setattr(u64map, "_STEPS", 4)  # the overlay of a 32K base takes 5 merges of 1,024 to fill
    rng = np.random.default_rng(5)
    keys = rng.choice(1 << 62, size=64_000, replace=False).astype(np.uint64)
    m = U64Map()
    m.assign(np.sort(keys[:32_000]), np.sort(keys[:32_000]))
    m.arrays()  # all in the base
    expected = {int(k): int(k) for k in keys[:32_000]}
    base, written, steps = m._keys, 0, 0
    for key in keys[32_000:].tolist():  # single changes: a merge into the overlay every 1,024
        m[key] = key + 1
        expected[key] = key + 1
        if m._keys is not base:
            break
        if m._written != written:
            assert m._written - written <= 8_000 + len(m._frozen_keys)  # a step: a quarter of the base, its new keys
            written, steps = m._written, steps + 1
    # three steps wrote into the new base while the old one served every lookup; the fourth completed and replaced it
    assert m._keys is not base and steps == 3
    victims = keys[:10].tolist()
    for key in victims:
        del expected[key]
    assert m.pop_many(victims) == [int(k) for k in keys[:10]]
    probe = rng.permutation(keys)
    found, values = m.lookup(probe)
    assert found.tolist() == [int(k) in expected for k in probe.tolist()]
    assert values.tolist() == [expected.get(int(k), 0) for k in probe.tolist()]
    assert dict(m.items()) == expected and len(m) == len(expected)


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
