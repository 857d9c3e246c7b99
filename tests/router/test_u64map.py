import random

from semblend_dynamo.router.u64map import U64Map


def test_the_map_behaves_as_a_dict_through_merges() -> None:
    rng = random.Random(7)
    keys = [rng.randrange(1 << 64) for _ in range(300)] + [0, (1 << 64) - 1]
    m, d = U64Map(), dict[int, int]()
    for step in range(20_000):
        op = rng.random()
        batch = rng.sample(keys, rng.randrange(1, 6))
        if op < 0.35:
            key, value = batch[0], rng.randrange(1 << 64)
            m[key] = value
            d[key] = value
        elif op < 0.5:
            values = [rng.randrange(1 << 64) for _ in batch]
            m.set_many(batch, values)
            d.update(zip(batch, values, strict=True))
        elif op < 0.65:
            assert m.pop(batch[0]) == d.pop(batch[0], None)
        elif op < 0.75:
            batch.append(batch[0])  # named twice: the second finds it gone
            assert m.pop_many(batch) == [d.pop(k, None) for k in batch]
        elif op < 0.98:
            assert m.get_many(batch) == [d.get(k) for k in batch]
            assert m.get(batch[0]) == d.get(batch[0]) and (batch[0] in m) == (batch[0] in d)
        else:
            assert dict(m.items()) == d
        assert len(m) == len(d), step
    m.clear()
    assert len(m) == 0 and m.get(keys[0]) is None and list(m.items()) == []
