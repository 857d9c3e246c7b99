"""Residency: donors are resident exactly while all their blocks are stored on their live worker."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from semblend_dynamo.events.schemas import DonorRegistration, KvCleared, KvEvent, KvRemoved, KvStored
from semblend_dynamo.router import residency, u64map
from semblend_dynamo.router.residency import SHARED, DonorEntry, Residency
from semblend_dynamo.router.u64map import U64Map

W1, W2 = 11, 22


def _donor(donor_id: str, worker: int, hashes: list[int], namespace: str = "ns") -> DonorRegistration:
    return DonorRegistration(
        donor_id=donor_id,
        worker_id=worker,
        deployment="d",
        namespace=namespace,
        num_tokens=16 * len(hashes),
        block_size=16,
        block_hashes=hashes,
        embedding=b"",
        embedding_dim=0,
    )


class Events:
    """Builds kv-events for one worker with increasing event ids (engine id = 1000 + tokens_hash)."""

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.event_id = 0

    def _event(self, data: KvStored | KvRemoved | KvCleared) -> KvEvent:
        self.event_id += 1
        return KvEvent(worker_id=self.worker, event_id=self.event_id, data=data)

    def stored(self, *hashes: int) -> KvEvent:
        return self._event(KvStored(block_hashes=[1000 + h for h in hashes], tokens_hashes=list(hashes)))

    def removed(self, *hashes: int) -> KvEvent:
        return self._event(KvRemoved(block_hashes=[1000 + h for h in hashes]))

    def cleared(self) -> KvEvent:
        return self._event(KvCleared())


def test_donor_becomes_resident_when_its_last_block_arrives_and_leaves_with_any_block() -> None:
    r, ev = Residency(capacity=10), Events(W1)
    r.add_donor(_donor("a", W1, [1, 2, 3]))
    r.apply(ev.stored(1, 2))
    assert not r.is_resident("a") and r.resident("ns") == set()
    assert r.take_changes() == []
    r.apply(ev.stored(3))
    assert r.is_resident("a") and r.resident("ns") == {"a"}
    r.apply(ev.removed(2))
    assert not r.is_resident("a") and r.resident("ns") == set()
    r.apply(ev.stored(2))
    assert r.resident("ns") == {"a"}
    assert r.take_changes() == [("a", True), ("a", False), ("a", True)]


def test_blocks_on_another_worker_do_not_make_a_donor_resident() -> None:
    r = Residency(capacity=10)
    r.add_donor(_donor("a", W1, [1, 2]))
    r.apply(Events(W2).stored(1, 2))
    assert not r.is_resident("a")
    assert r.blocks_on((W2, 0)) == 2


def test_a_block_held_twice_stays_until_both_copies_are_removed() -> None:
    r, ev = Residency(capacity=10), Events(W1)
    r.apply(ev.stored(1))
    r.apply(KvEvent(worker_id=W1, event_id=99, data=KvStored(block_hashes=[5000], tokens_hashes=[1])))
    r.add_donor(_donor("a", W1, [1]))
    assert r.is_resident("a")
    r.apply(ev.removed(1))
    assert r.is_resident("a")
    r.apply(KvEvent(worker_id=W1, event_id=100, data=KvRemoved(block_hashes=[5000])))
    assert not r.is_resident("a")


def test_cleared_and_worker_departure() -> None:
    r, ev1, ev2 = Residency(capacity=10), Events(W1), Events(W2)
    r.add_donor(_donor("a", W1, [1]))
    r.add_donor(_donor("b", W2, [2]))
    r.apply(ev1.stored(1))
    r.apply(ev2.stored(2))
    assert r.resident("ns") == {"a", "b"}
    r.apply(ev1.cleared())
    assert r.resident("ns") == {"b"} and "a" in r
    r.add_donor(_donor("c", W2 + 1, [3]))  # a worker with donors and no blocks yet
    assert r.donors_per_worker() == {(W1, 0): (1, 0), (W2, 0): (1, 1), (W2 + 1, 0): (1, 0)}
    assert sorted(r.retain_workers({W1})) == ["b", "c"]
    assert "b" not in r and r.resident("ns") == set() and r.blocks_on((W2, 0)) == 0
    assert r.donors_per_worker() == {(W1, 0): (1, 0)} and r.retain_workers({W1}) == []


def test_namespaces_are_separate_and_capacity_evicts_oldest() -> None:
    r, ev = Residency(capacity=2), Events(W1)
    r.apply(ev.stored(1, 2, 3))
    r.add_donor(_donor("a", W1, [1], namespace="tenantA"))
    r.add_donor(_donor("b", W1, [2], namespace="tenantB"))
    assert r.resident("tenantA") == {"a"} and r.resident("tenantB") == {"b"}
    assert r.add_donor(_donor("c", W1, [3], namespace="tenantB")) == ["a"]
    assert r.resident("tenantA") == set() and r.resident("tenantB") == {"b", "c"}


def test_capacity_evicts_the_least_recently_added_donor_through_replacements_and_removals() -> None:
    """The donors leave oldest first (a donor added again counts from then), as an insertion-ordered map of the
    donors would say, through many replacements and removals (old records of the add order are dropped)."""
    rng = random.Random(11)
    capacity = 40
    r = Residency(capacity=capacity)
    model: dict[str, None] = {}  # insertion order: re-added donors move to the end
    for step in range(3000):
        donor_id = f"d{rng.randrange(120)}"
        if rng.random() < 0.2:
            assert r.remove_donor(donor_id) == (model.pop(donor_id, 0) is None)
            continue
        model.pop(donor_id, None)
        model[donor_id] = None
        expected = []
        while len(model) > capacity:
            oldest = next(iter(model))
            del model[oldest]
            expected.append(oldest)
        if step % 3:
            assert r.add_donor(_donor(donor_id, rng.choice((W1, W2)), [rng.randrange(1, 50)])) == expected
        else:
            regs = [_donor(donor_id, W1, [7])]
            assert r.add_many(regs) == expected
        assert [entry.donor_id for entry in r.donors()] == list(model)
    assert len(r) == len(model)


def test_a_large_batch_ends_as_its_donors_added_one_by_one() -> None:
    """A batch large enough to be grouped by worker in bulk (hundreds of donors over several workers, hashes shared
    between donors, some donors twice) ends as the same donors added in turn; its donors keep the batch's order."""
    rng = random.Random(3)
    workers = (W1, W2, 33, 44, 55)
    regs = [
        _donor(f"d{rng.randrange(500)}", rng.choice(workers), rng.sample(range(1, 400), rng.randrange(1, 6)))
        for _ in range(700)
    ]
    batched, in_turn = Residency(capacity=450), Residency(capacity=450)
    for r in (batched, in_turn):
        for w in workers:
            r.apply(KvEvent(worker_id=w, event_id=1, data=KvStored(list(range(1000, 1300)), list(range(1, 301)))))
    evicted = batched.add_many(regs)
    assert evicted == [d for reg in regs for d in in_turn.add_donor(reg)]
    assert batched.snapshot() == in_turn.snapshot()
    assert [e.donor_id for e in batched.donors()] == [e.donor_id for e in in_turn.donors()]
    assert batched.donors_per_worker() == in_turn.donors_per_worker()


def test_a_dump_adds_missed_blocks_and_never_drops_live_ones() -> None:
    r, ev = Residency(capacity=10), Events(W1)
    r.add_donor(_donor("a", W1, [1, 2]))
    r.add_donor(_donor("b", W1, [3]))
    r.apply(ev.stored(1, 2))
    r.take_changes()
    dump = Events(W1)
    dump.event_id = -1  # dump event ids are synthetic (0)
    r.merge_dump([dump.stored(3), dump.removed(1)])  # the recovered index knows block 3; removals are ignored
    assert r.resident("ns") == {"a", "b"}
    assert r.take_changes() == [("b", True)]
    assert r.event_gaps == 0


def test_a_dump_taken_in_one_batch_per_worker_ends_as_its_events_one_by_one() -> None:
    rng = random.Random(5)
    for _ in range(30):
        batched, in_turn = Residency(capacity=100), Residency(capacity=100)
        streams = {w: Events(w) for w in (W1, W2)}
        for i in range(12):
            donor = _donor(f"d{i}", rng.choice((W1, W2)), rng.sample(range(40), rng.randrange(1, 5)))
            batched.add_donor(donor)
            in_turn.add_donor(donor)
        dump = []
        for _ in range(rng.randrange(1, 30)):
            stream = streams[rng.choice((W1, W2))]
            engine_ids = [1000 + rng.randrange(40) for _ in range(rng.randrange(1, 6))]  # re-stores and repeats
            dump.append(stream._event(KvStored(engine_ids, [rng.randrange(40) for _ in engine_ids])))
        batched.merge_dump(dump)
        for event in dump:
            in_turn.apply(event)
        assert batched.snapshot() == in_turn.snapshot()
        assert [batched.blocks_on((w, 0)) for w in (W1, W2)] == [in_turn.blocks_on((w, 0)) for w in (W1, W2)]


def test_event_id_gaps_and_foreign_tiers_are_counted() -> None:
    r, ev = Residency(capacity=10), Events(W1)
    r.apply(ev.stored(1))
    ev.event_id += 3
    r.apply(ev.stored(2))
    assert r.event_gaps == 1
    r.apply(KvEvent(worker_id=W1, event_id=50, storage_tier="host_pinned", data=KvRemoved(block_hashes=[1001])))
    r.apply(ev.removed(77))
    assert r.ignored_events == {"storage_tier": 1, "unknown_block": 1}
    assert r.blocks_on((W1, 0)) == 2


def test_reconcile_makes_blocks_exactly_the_index_dump() -> None:
    """The zmq event plane's path: each read of Dynamo's index is the whole truth for every worker."""
    r, e1, e2 = Residency(capacity=10), Events(W1), Events(W2)
    r.add_donor(_donor("a", W1, [1, 2]))
    r.add_donor(_donor("b", W2, [5]))
    assert r.reconcile([e1.stored(1, 2), e2.stored(5, 6)]) == 4
    assert r.take_changes() == [("a", True), ("b", True)]
    assert r.reconcile([e1.stored(1, 2), e2.stored(5, 6)]) == 0  # an unchanged index changes nothing
    assert r.reconcile([e1.stored(1), e2.stored(5, 6)]) == 1  # block 2 evicted
    assert r.take_changes() == [("a", False)]
    assert r.reconcile([e1.stored(1, 2)]) == 3  # 2 re-stored; W2 absent from the index: its blocks are gone
    assert r.take_changes() == [("a", True), ("b", False)]
    assert r.blocks_on((W2, 0)) == 0 and r.blocks_on((W1, 0)) == 2


def test_catalog_entry_gives_back_the_registration_it_was_built_from() -> None:
    """Entries are compact (slots, shared strings), yet a peer's sync reply re-sends the same registration."""
    from semblend_dynamo.events.codec import decode, encode

    sent = DonorRegistration(
        donor_id="a",
        donor_key="ab" * 8,
        router_id="peer",
        worker_id=W1,
        dp_rank=1,
        deployment="cd" * 8,
        namespace="ef" * 8,
        num_tokens=40,
        block_size=16,
        block_hashes=[5, 6],
        embedding=b"\x00\x3c" * 4,
        embedding_dim=4,
    )
    r = Residency(capacity=10)
    r.add_donor(decode(encode(sent), DonorRegistration, max_bytes=1 << 16))
    r.add_donor(decode(encode(sent.model_copy(update={"donor_id": "b"})), DonorRegistration, max_bytes=1 << 16))
    a, b = r.donor("a"), r.donor("b")
    assert a is not None and b is not None
    assert a.registration == sent
    assert decode(encode(a.registration), DonorRegistration, max_bytes=1 << 16) == sent
    assert a.namespace is b.namespace and a.deployment is b.deployment  # one copy for every donor
    assert not hasattr(a, "__dict__")


def test_donors_sharing_a_block_follow_it_together_and_alone_once_one_leaves() -> None:
    """A block hash used by several donors (a common system prompt) keeps a posting per donor through add and remove."""
    r = Residency(capacity=10)
    ev = Events(W1)
    for donor_id, own in (("a", 2), ("b", 3), ("c", 4)):
        r.add_donor(_donor(donor_id, W1, [1, own]))
    r.apply(ev.stored(1, 2, 3, 4))
    assert r.resident("ns") == {"a", "b", "c"}
    r.remove_donor("b")
    r.apply(ev.removed(1))
    assert r.resident("ns") == set()
    r.remove_donor("c")
    r.apply(ev.stored(1))
    assert r.resident("ns") == {"a"}  # the shared hash now has one donor left, and still brings it back
    r.add_donor(_donor("b", W1, [1, 3]))
    assert r.resident("ns") == {"a", "b"}
    r.remove_donor("a")
    r.remove_donor("b")
    r.apply(ev.removed(1))
    r.apply(ev.stored(1))
    assert r.resident("ns") == set() and r.take_changes()[-1] == ("b", True)


def test_random_events_and_donors_agree_with_a_plain_model() -> None:
    """Stores (some re-storing an engine block with another hash), removals, clears, donors added in batches (sharing
    hashes or not) and removed: a donor is resident exactly while every hash of it is stored on its worker."""
    rng = random.Random(5)
    r = Residency(capacity=10_000)
    events = {w: Events(w) for w in (W1, W2)}
    stored: dict[int, dict[int, int]] = {W1: {}, W2: {}}  # worker -> engine block -> tokens_hash
    donors: dict[str, tuple[int, list[int]]] = {}
    for step in range(3000):
        op, w = rng.random(), rng.choice((W1, W2))
        if op < 0.35:
            engine = rng.sample(range(60), rng.randrange(1, 8))
            hashes = [rng.randrange(1, 40) for _ in engine]
            r.apply(
                KvEvent(
                    worker_id=w,
                    event_id=events[w].event_id + 1,
                    data=KvStored(block_hashes=engine, tokens_hashes=hashes),
                )
            )
            events[w].event_id += 1
            stored[w].update(zip(engine, hashes, strict=True))
        elif op < 0.55:
            engine = rng.sample(range(60), rng.randrange(1, 6))
            r.apply(KvEvent(worker_id=w, event_id=events[w].event_id + 1, data=KvRemoved(block_hashes=engine)))
            events[w].event_id += 1
            for block in engine:
                stored[w].pop(block, None)
        elif op < 0.57:
            r.apply(events[w].cleared())
            stored[w].clear()
        elif op < 0.85:
            batch = []
            for _ in range(rng.randrange(1, 6)):
                donor_id = f"d{rng.randrange(200)}"
                worker = rng.choice((W1, W2))
                pool = range(1, 40) if rng.random() < 0.7 else range(1000 + 100 * step, 1100 + 100 * step)
                hashes = rng.sample(pool, rng.randrange(1, 5)) if rng.random() < 0.97 else []
                batch.append(_donor(donor_id, worker, hashes))
                donors[donor_id] = (worker, hashes)
            r.add_many(batch)
        elif donors:
            donor_id = rng.choice(sorted(donors))
            assert r.remove_donor(donor_id)
            del donors[donor_id]
        resident = {d for d, (worker, hashes) in donors.items() if set(hashes) <= set(stored[worker].values())}
        assert {d for d in donors if r.is_resident(d)} == resident, step
        assert r.resident("ns") == resident and r.resident_count("ns") == len(resident), step
        assert {w: r.blocks_on((w, 0)) for w in stored} == {w: len(blocks) for w, blocks in stored.items()}
        per_worker = {
            (w, 0): (sum(1 for worker, _ in donors.values() if worker == w), sum(donors[d][0] == w for d in resident))
            for w in stored
        }
        assert r.donors_per_worker() == {key: held for key, held in per_worker.items() if held[0]}, step
    for donor_id in list(donors):
        r.remove_donor(donor_id)
    for w in stored:
        r.apply(events[w].cleared())
    assert all(len(blocks.hashes) == 0 and not blocks.shared for blocks in r._workers.values())


needs_compiled_gate = pytest.mark.skipif(
    u64map.NATIVE_GATE is None, reason=f"no compiled gate: {u64map.NATIVE_GATE_REASON}"
)


def _small_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block maps whose levels fill, merge and are rewritten within a few events."""
    for name, bound in (("_MIN_DELTA", 2), ("_MAX_DELTA", 4), ("_MIN_OVERLAY", 8), ("_OVERLAY_PER_ROOT", 1)):
        monkeypatch.setattr(u64map, name, bound)
    for name, bound in (("_BULK", 6), ("_MIN_STEP", 3), ("_MAX_STEP", 5)):
        monkeypatch.setattr(u64map, name, bound)


def _gate_answers(r: Residency, probe: list[int]) -> tuple[object, object]:
    """The gate's answers, locked and lock-free, on the compiled path and on the Python one (each pair must match)."""
    compiled = r.stored_together(probe), r.read_stored_together(probe)
    return compiled, (r._stored_together_python(probe), r._read_stored_together_python(probe))


@needs_compiled_gate
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_compiled_gate_answers_as_the_python_gate(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores (single and bulk, engine blocks re-stored with another hash), removals, clears, donors posting hashes
    (stored or not: a posting alone is no stored block) and leaving, ranks leaving, on six ranks with small map levels
    (dict changes, overlays, rewrites of the base in steps): after each step both gates give the same answer for
    hashes held or not on any rank, out of u64 range, none or several, and the lock-free one the same None while a
    change runs on some of the maps (their ``_busy`` set, as a running change leaves it). The plain model agrees."""
    _small_levels(monkeypatch)
    rng = random.Random(seed)
    r = Residency(capacity=60)
    ranks = [(w, dp) for w in (W1, W2, 33) for dp in (0, 1)]
    event_ids = dict.fromkeys(ranks, 0)
    engine: dict[tuple[int, int], dict[int, int]] = {rank: {} for rank in ranks}  # engine block -> tokens_hash
    pool = list(range(1, 150))
    odd = [0, (1 << 64) - 1, 1 << 64, -1, 1 << 70]
    donors = 0
    answers: Counter[object] = Counter()
    for step in range(1200):
        op, rank = rng.random(), rng.choice(ranks)
        data: KvStored | KvRemoved | KvCleared | None = None
        if op < 0.4:
            blocks = rng.sample(range(400), rng.randrange(1, 9) if rng.random() < 0.8 else rng.randrange(64, 120))
            data = KvStored(block_hashes=blocks, tokens_hashes=[rng.choice(pool) for _ in blocks])
            engine[rank].update(zip(blocks, data.tokens_hashes, strict=True))
        elif op < 0.6:
            blocks = rng.sample(range(400), rng.randrange(1, 40))
            data = KvRemoved(block_hashes=blocks)
            for block in blocks:
                engine[rank].pop(block, None)
        elif op < 0.62:
            data = KvCleared()
            engine[rank].clear()
        elif op < 0.85:
            batch = []
            for _ in range(rng.randrange(1, 4)):
                worker, dp = rng.choice(ranks)
                donor = _donor(f"d{donors}", worker, rng.sample(pool, rng.randrange(1, 6)))
                batch.append(donor.model_copy(update={"dp_rank": dp}))
                donors += 1
            r.add_many(batch)
        elif op < 0.97 and len(r):
            r.remove_donor(rng.choice(sorted(entry.donor_id for entry in r.donors())))
        else:
            r.remove_worker(rank)
            engine[rank].clear()
        if data is not None:
            event_ids[rank] += 1
            r.apply(KvEvent(worker_id=rank[0], dp_rank=rank[1], event_id=event_ids[rank], data=data))
        maps = [blocks.hashes for blocks in r._workers.values()]
        for _ in range(6):
            probe = rng.sample(pool, 2) if rng.random() < 0.8 else rng.sample(pool + odd, rng.randrange(0, 12))
            compiled, python = _gate_answers(r, probe)
            assert compiled == python, (step, probe)
            model = any(set(probe) <= set(held.values()) for held in engine.values() if held)
            assert compiled[0] is model, (step, probe)
            answers[compiled] += 1
            changing = rng.sample(maps, rng.randrange(1, len(maps) + 1)) if maps else []
            for m in changing:
                m._busy += 1
            compiled, python = _gate_answers(r, probe)
            assert compiled == python and compiled[0] is model, (step, probe)
            answers["changing" if changing else "no rank", compiled[1]] += 1
            for m in changing:
                m._busy -= 1
    assert answers[True, True] > 100 and answers[False, False] > 100
    assert answers["changing", None] > 100 and answers["changing", True] > 20
    assert answers["changing", False] == 0  # a map changing may hold them all


@needs_compiled_gate
def test_the_compiled_gate_is_unsure_only_of_a_map_a_change_is_running_on() -> None:
    r = Residency(capacity=10)
    r.apply(Events(W1).stored(1, 2))
    r.apply(Events(W2).stored(1, 3))
    first, second = (r._workers[W1, 0].hashes, r._workers[W2, 0].hashes)
    assert _gate_answers(r, [1, 2]) == ((True, True), (True, True))
    first._busy = 1  # a change running on the rank holding both
    assert _gate_answers(r, [1, 2]) == ((True, None), (True, None))
    assert _gate_answers(r, [1, 3]) == ((True, True), (True, True))  # the other rank holds both: known
    second._busy = 1
    assert _gate_answers(r, [1, 3]) == ((True, None), (True, None))
    first._busy = second._busy = 0
    assert _gate_answers(r, [1, 4]) == ((False, False), (False, False))


def test_the_python_gate_is_unsure_of_a_map_whose_changes_moved_during_its_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the lock, a change may start and end on another thread during the reads: the map's count moved (the
    compiled gate holds the GIL through its reads, so none can)."""
    r = Residency(capacity=10)
    r.apply(Events(W1).stored(1, 2))
    counts = iter(range(100))
    monkeypatch.setattr(U64Map, "quiet", lambda self: next(counts))
    assert r._read_stored_together_python([1, 2]) is None
    assert r._stored_together_python([1, 2]) is True


def test_without_the_compiled_map_the_gate_takes_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SEMBLEND_NATIVE_MAP=0`` turns the compiled gate off with the maps' other compiled parts (and says so): the
    maps keep no view of their levels and the gate reads them in Python."""
    monkeypatch.setenv(u64map.NATIVE_ENV, "0")
    assert u64map._load_gate() == (None, None, f"{u64map.NATIVE_ENV}=0")
    monkeypatch.setattr(u64map, "NATIVE_LEVELS", None)
    monkeypatch.setattr(residency, "NATIVE_GATE", None)
    r = Residency(capacity=10)
    r.apply(Events(W1).stored(1, 2))
    assert r._workers[W1, 0].hashes._view is None
    assert r.stored_together([1, 2]) is True and r.read_stored_together([2, 3]) is False


def test_an_entry_packs_hashes_and_embedding_and_drops_only_the_embedding() -> None:
    from semblend_dynamo.router.residency import DonorEntry

    registration = DonorRegistration(
        donor_id="a",
        donor_key="k",
        worker_id=W1,
        deployment="d",
        namespace="ns",
        num_tokens=48,
        block_size=16,
        block_hashes=[1, 2**64 - 1, 3],
        embedding=bytes(range(8)),
        embedding_dim=4,
        registered_at=5.0,
    )
    entry = DonorEntry.of(registration, (W1, 0))
    assert list(entry.block_hashes) == [1, 2**64 - 1, 3] and entry.embedding == bytes(range(8))
    assert entry.registration == registration
    entry.drop_embedding()
    assert entry.own_embedding is None and list(entry.block_hashes) == [1, 2**64 - 1, 3]
    with pytest.raises(LookupError):
        entry.vector()


def test_an_entry_keeps_its_slot_and_stamp_in_its_blob_through_embedding_changes() -> None:
    """The slot, ``registered_at``, ``hashes_end`` and ``embedding_dim`` live in the blob's head: setting the slot and
    dropping the embedding keep them (and the hashes); an entry without an embedding holds its (empty) one."""
    from semblend_dynamo.router.residency import NO_SLOT, DonorEntry

    registration = _donor("a", W1, [7, 2**64 - 2]).model_copy(
        update={"embedding": bytes(range(8)), "embedding_dim": 4, "registered_at": 1234.5}
    )
    entry = DonorEntry.of(registration, (W1, 0))
    assert entry.slot == NO_SLOT and entry.registered_at == 1234.5
    entry.slot = 70_000
    assert entry.slot == 70_000 and entry.registered_at == 1234.5 and entry.embedding == bytes(range(8))
    entry.drop_embedding()
    assert not entry.embedded and entry.own_embedding is None
    assert entry.slot == 70_000 and entry.registered_at == 1234.5 and list(entry.block_hashes) == [7, 2**64 - 2]
    assert entry.hashes_end == 16 and entry.embedding_dim == 4
    plain = DonorEntry.of(_donor("b", W1, [1]), (W1, 0))
    assert plain.embedded and plain.own_embedding == b""


def test_an_entry_of_codes_keeps_its_form_through_embedding_changes() -> None:
    """A catalog keeping int8 codes: the entry holds the codes (half the float16 bytes), its vector is their unit
    vector, its registration carries that vector in float16, and setting the slot and dropping the embedding keep the
    form."""
    from semblend_dynamo.router.residency import DonorEntry
    from semblend_dynamo.vector_codes import i8_codes

    vector = np.random.default_rng(9).standard_normal(32).astype(np.float32)
    embedding, dim = DonorRegistration.pack_embedding(vector)
    registration = _donor("a", W1, [7]).model_copy(update={"embedding": embedding, "embedding_dim": dim})
    r = Residency(capacity=10, codes=True)
    r.add_many([registration, _donor("b", W1, [8])])
    entry, plain = r.entries(["a", "b"])
    codes = i8_codes(registration.vector().reshape(1, -1))[0][0]
    assert entry.embedding_codes and entry.embedding == codes.tobytes() and entry.embedding_dim == 32
    unit = codes.astype(np.float32) / np.linalg.norm(codes.astype(np.float32))
    assert np.array_equal(entry.vector(), unit) and float(entry.vector() @ vector) / np.linalg.norm(vector) > 0.999
    assert entry.registration.embedding == unit.astype("<f2").tobytes()
    entry.slot = 5
    entry.drop_embedding()
    assert entry.embedding_codes and entry.own_embedding is None
    assert plain.embedding == b"" and plain.embedded  # no embedding: nothing to convert
    assert not DonorEntry.of(registration, (W1, 0)).embedding_codes  # float16 unless asked


def test_sync_rows_take_the_slots_they_were_built_with_and_give_them_back_on_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from semblend_dynamo.events.codec import decode, encode
    from semblend_dynamo.events.schemas import DonorSyncPage

    registrations = [
        _donor(f"d{i}", (W1, W2)[i % 2], [i + 1, 100 + i]).model_copy(update={"registered_at": 10.0 + i})
        for i in range(300)
    ]
    page = DonorSyncPage.of(
        registrations, router_id="peer", deployment="d", after=0, upto=None, next_cursor=None, last_cursor=300
    )
    rows = decode(encode(page), DonorSyncPage, max_bytes=1 << 22).rows()
    r = Residency(capacity=1000)
    r.add_many([_donor("x", W1, [5000]), _donor("y", W1, [5001])])
    r.remove_donor("x")  # a freed slot, taken again first
    entries, evicted = r.add_rows([(rows, range(200)), (rows, range(200, 280))], new=True)
    assert not evicted and len(r) == 281
    assert len({entry.slot for entry in entries}) == 280 and all(r._slots[e.slot] is e for e in entries)
    assert [e.registered_at for e in entries] == [10.0 + i for i in range(280)]
    assert [e.registration for e in entries] == registrations[:280]
    held = len(r._slots)
    failing = Residency._entries
    calls = []

    def entries_failing_on_the_second_part(self: Residency, *args: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a broken part")
        return failing(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Residency, "_entries", entries_failing_on_the_second_part)
    with pytest.raises(RuntimeError):
        r.add_rows([(rows, range(280, 290)), (rows, range(290, 300))], new=True)
    monkeypatch.undo()
    assert len(r) == 281 and "d280" not in r
    entries, _ = r.add_rows([(rows, range(280, 300))], new=True)  # the slots given back are taken again
    assert len(r._slots) == held + 20 and not r._free and all(r._slots[e.slot] is e for e in entries)


def test_sync_rows_of_several_workers_post_as_their_registrations_do() -> None:
    from semblend_dynamo.events.codec import decode, encode
    from semblend_dynamo.events.schemas import DonorSyncPage

    # on W1 every hash is stored (resident at once), on W2 some are; d7 and d9 share hash 700 on W2
    registrations = [
        _donor(f"d{i}", (W1, W2)[i % 2], [700] if i in (7, 9) else [10 * i + 1, 10 * i + 2]).model_copy(
            update={"registered_at": 10.0 + i}
        )
        for i in range(12)
    ]
    page = DonorSyncPage.of(
        registrations, router_id="peer", deployment="d", after=0, upto=None, next_cursor=None, last_cursor=12
    )
    rows = decode(encode(page), DonorSyncPage, max_bytes=1 << 22).rows()
    replicas = [Residency(capacity=100), Residency(capacity=100)]
    for r in replicas:
        r.apply(Events(W1).stored(*(h for reg in registrations[0::2] for h in reg.block_hashes)))
        r.apply(Events(W2).stored(31, 32, 52, 700))
    by_rows, by_registrations = replicas
    picked = [5, 0, 7, 2, 8, 9, 4, 1]  # not a range: a chunk of one page's rows mixing workers
    by_rows.add_rows([(rows, picked), (rows, range(10, 12))], new=True)
    by_registrations.add_many([registrations[i] for i in [*picked, 10, 11]])
    assert by_rows.snapshot() == by_registrations.snapshot()
    assert sorted(by_rows.take_changes()) == sorted(by_registrations.take_changes())
    for key in ((W1, 0), (W2, 0)):
        assert list(by_rows._workers[key].hashes.items()) == list(by_registrations._workers[key].hashes.items())
    assert {e.donor_id: e.missing for e in by_rows.donors()} == {
        e.donor_id: e.missing for e in by_registrations.donors()
    }
    assert by_rows.resident("ns") == {"d0", "d2", "d4", "d7", "d8", "d9", "d10"}


@pytest.mark.parametrize("codes", [False, True])
def test_sync_rows_of_one_size_build_and_post_what_their_registrations_do(codes: bool) -> None:
    """A page whose rows all have as many hashes and embedding bytes (its blobs built as one array, its hashes posted
    from rows of them) ends exactly as the same donors added from their registrations: the same blobs, postings,
    residency, changes and per-worker counts (in order), and the postings and missing counts the kv-events give."""
    from semblend_dynamo.events.codec import decode, encode
    from semblend_dynamo.events.schemas import DonorSyncPage

    rng = np.random.default_rng(5)
    workers = (W1, W2, 33)
    registrations = []
    for i in range(124):
        vector = rng.standard_normal(8).astype(np.float32)
        hashes = [1000 * i + k for k in range(1, 5 if i < 120 else 2 + i % 2)]  # the third page: rows of 1 or 2
        if i in (31, 61):  # two donors of worker W2 (i % 3 == 1) share a hash: that worker's batch is posted one by one
            hashes[0] = 777
        registrations.append(
            _donor(f"d{i:03d}", workers[i % 3], hashes, namespace=("a", "b")[i % 2]).model_copy(
                update={
                    "registered_at": 10.0 + i,
                    "embedding": (vector / np.linalg.norm(vector)).astype("<f2").tobytes(),
                    "embedding_dim": 8,
                    "donor_key": f"k{i}",
                    "dp_rank": int(i >= 60 and i % 3 == 2),  # the second page: worker 33 on rank 1
                }
            )
        )
    source = Residency(capacity=1000, codes=codes)  # the peer: its entries go on the page in the form it keeps
    source.add_many(registrations)
    pages = [
        decode(
            encode(
                DonorSyncPage.of(
                    entries, router_id="p", deployment="d", after=0, upto=None, next_cursor=None, last_cursor=124
                )
            ),
            DonorSyncPage,
            max_bytes=1 << 22,
        ).rows()
        for entries in (
            source.entries(r.donor_id for r in registrations[:60]),
            source.entries(r.donor_id for r in registrations[60:120]),
            source.entries(r.donor_id for r in registrations[120:]),
        )
    ]
    assert [rows.row_sizes for rows in pages] == [(4, 8 if codes else 16)] * 2 + [None]
    replicas = [Residency(capacity=1000, codes=codes) for _ in range(2)]
    for r in replicas:
        r.apply(Events(W1).stored(*(h for reg in registrations[0::3] for h in reg.block_hashes)))  # all stored
        r.apply(Events(W2).stored(777, *(h for reg in registrations[1::6] for h in reg.block_hashes)))  # some
        r.add_many([_donor("x", W1, [5])])
        r.remove_donor("x")  # a slot freed: taken again first
    by_rows, by_registrations = replicas
    parts = [(pages[0], [5, 0, 7, 2, 8, 9, 4, 1]), (pages[1], range(0, 60)), (pages[0], range(10, 60))]
    order = [*(parts[0][1]), *(60 + i for i in range(60)), *range(10, 60)]
    ids = [registrations[i].donor_id for i in order]
    entries, evicted = by_rows.add_rows(parts, new=True, ids=ids)
    by_registrations.add_many([source.entries([donor_id])[0].registration for donor_id in ids])
    assert not evicted and [e.donor_id for e in entries] == ids
    more = [registrations[i].donor_id for i in (123, 121, 120, 122, 6, 3)]  # a chunk mixing rows of other sizes
    entries, _ = by_rows.add_rows([(pages[2], [3, 1, 0, 2]), (pages[0], [6, 3])], new=True, ids=more)
    by_registrations.add_many([source.entries([donor_id])[0].registration for donor_id in more])
    assert [e.donor_id for e in entries] == more
    ids += more
    for donor_id in ids:
        mine, theirs = by_rows.donor(donor_id), by_registrations.donor(donor_id)
        assert mine is not None and theirs is not None
        for name in DonorEntry.__slots__:
            assert getattr(mine, name) == getattr(theirs, name), name
    assert by_rows.snapshot() == by_registrations.snapshot()
    assert sorted(by_rows.take_changes()) == sorted(by_registrations.take_changes())
    for key in by_registrations._workers:
        mine_blocks, their_blocks = by_rows._workers[key], by_registrations._workers[key]
        assert list(mine_blocks.hashes.items()) == list(their_blocks.hashes.items())
        assert mine_blocks.shared == their_blocks.shared
    for counts in ("_worker_donors", "_worker_resident", "_resident_counts"):
        assert list(getattr(by_rows, counts).items()) == list(getattr(by_registrations, counts).items()), counts
    donors = list(by_rows.donors())
    stored = {W1: {h for reg in registrations[0::3] for h in reg.block_hashes}, 33: set()}
    stored[W2] = {777, *(h for reg in registrations[1::6] for h in reg.block_hashes)}
    for entry in donors:  # checked against the kv-events themselves, not only against the other path
        blocks = by_rows._workers[entry.worker]
        for tokens_hash in entry.block_hashes:
            value = blocks.hashes.get(tokens_hash)
            assert value is not None and (value >> 32 == 1) == (tokens_hash in stored[entry.worker[0]])
            assert value & SHARED == entry.slot + 1 or entry.slot in blocks.shared[tokens_hash]
        assert entry.missing == sum(h not in stored[entry.worker[0]] for h in entry.block_hashes)
    assert len(donors) == 124
    assert by_rows._worker_donors == Counter(e.worker for e in donors)
    assert by_rows._worker_resident == Counter(e.worker for e in donors if e.missing == 0)
    assert by_rows._resident_counts == Counter(e.namespace for e in donors if e.missing == 0)
    assert by_rows.resident("a") and by_rows.resident("a") == by_registrations.resident("a")
    assert len(by_rows._slots) == len(by_registrations._slots) and not by_rows._free


def test_a_row_picker_picks_as_pick_does() -> None:
    from semblend_dynamo.events.schemas import SyncRows

    column = [f"v{i}" for i in range(10)]
    for picked in (range(10), range(2, 7), range(0, 10, 3), [4], [], [9, 0, 3], range(0)):
        assert SyncRows.picker(picked)(column) == SyncRows.pick(column, picked)


class _GeneralStores(Residency):
    """A residency whose stored events all take the general path (the reference of the array path)."""

    def _store_new(self, *args: object) -> bool:
        return False


class _CountedStores(Residency):
    """A residency that counts the stored events its array path applied."""

    array_stores = 0

    def _store_new(self, *args: object) -> bool:
        taken = super()._store_new(*args)  # type: ignore[arg-type]
        self.array_stores += taken
        return taken


def _counted(r: Residency) -> object:
    """A residency's donors (slot and ``missing``), gaps and counters."""
    donors = {e.donor_id: (e.slot, e.missing) for e in r.donors()}
    return donors, r.event_gaps, r.ignored_events, r._resident_counts, r.donors_per_worker()


def _observed(r: Residency, keys: dict[tuple[int, int], set[int]], engine: dict[tuple[int, int], set[int]]) -> object:
    """What a residency shows, read without changing its maps' levels: each worker's block map and hash map at every
    key seen, shared postings, event ids, and :func:`_counted`."""
    return _counted(r), {
        key: (
            blocks.by_block.get_many(sorted(engine.get(key, ()))),
            blocks.hashes.get_many(sorted(keys.get(key, ()))),
            len(blocks.by_block),
            len(blocks.hashes),
            blocks.shared,
            blocks.last_event_id,
        )
        for key, blocks in r._workers.items()
    }


def _new_prompt(rng: random.Random, prompts: list[list[int]]) -> list[int]:
    """A prompt of a known prompt's prefix and fresh hashes, added to ``prompts``."""
    base = rng.choice(prompts)
    prompts.append(
        base[: rng.randrange(len(base) + 1)] + [rng.randrange(1, 1 << 63) for _ in range(rng.randrange(1, 150))]
    )
    return prompts[-1]


def test_stored_events_end_as_on_the_general_path() -> None:
    """Random stores (fresh prompts, shared prefixes, repeated hashes or engine blocks, re-stores), removals, clears and
    donors posted before and after their blocks (sharing hashes) end, event by event, exactly as with every store on
    the general path: the maps, shared postings, donors' ``missing``, the resident transitions in order, gaps."""
    for seed in range(6):
        rng = random.Random(seed)
        fast, general = _CountedStores(capacity=60), _GeneralStores(capacity=60)
        prompts: list[list[int]] = [[rng.randrange(1, 1 << 63) for _ in range(100)]]
        stored: dict[tuple[int, int], dict[int, int]] = {(W1, 0): {}, (W2, 0): {}}  # engine block -> hash, as sent
        keys: dict[tuple[int, int], set[int]] = {key: set() for key in stored}
        engine: dict[tuple[int, int], set[int]] = {key: set() for key in stored}
        event_ids = dict.fromkeys(stored, 0)
        next_block = 1
        for step in range(400):
            op, key = rng.random(), rng.choice(sorted(stored))
            event_ids[key] += 1 if rng.random() < 0.95 else 3
            if op < 0.4:
                hashes = list(rng.choice(prompts[-8:]) if rng.random() < 0.5 else _new_prompt(rng, prompts))
                if rng.random() < 0.1:  # a hash twice
                    hashes.append(rng.choice(hashes))
                blocks = list(range(next_block, next_block + len(hashes)))
                next_block += len(hashes)
                if rng.random() < 0.1 and stored[key]:  # a block stored again, as it is or with another hash
                    blocks[rng.randrange(len(blocks))] = rng.choice(sorted(stored[key]))
                if rng.random() < 0.05:  # an engine block twice
                    blocks[-1] = blocks[0]
                data: KvStored | KvRemoved | KvCleared = KvStored(blocks, hashes)
                stored[key].update(zip(blocks, hashes, strict=True))
                keys[key].update(hashes)
                engine[key].update(blocks)
            elif op < 0.55 and stored[key]:
                gone = rng.sample(sorted(stored[key]), min(len(stored[key]), rng.randrange(1, 120)))
                gone += [next_block + 10**9] if rng.random() < 0.1 else []  # an unknown block
                data = KvRemoved(gone)
                for block in gone:
                    stored[key].pop(block, None)
            elif op < 0.58:
                data = KvCleared()
                stored[key].clear()
            elif op < 0.9:
                batch = []
                if rng.random() < 0.3:  # donors of a prompt whose blocks come later
                    _new_prompt(rng, prompts)
                for _ in range(rng.randrange(1, 4)):
                    prompt = rng.choice(prompts[-8:])
                    start, end = sorted(rng.sample(range(len(prompt) + 1), 2))
                    pick = rng.random()  # a prefix, a run inside (disjoint from others) or hashes in any order
                    hashes = (
                        prompt[:end] if pick < 0.5 else prompt[start:end] if pick < 0.8 else rng.sample(prompt, end)
                    )
                    batch.append(_donor(f"d{rng.randrange(80)}", key[0], hashes))
                    keys[key].update(hashes)
                for r in (fast, general):
                    r.add_many(batch)
                assert fast.take_changes() == general.take_changes(), (seed, step)
                continue
            else:
                donor_id = rng.choice([e.donor_id for e in general.donors()] or ["none"])
                assert fast.remove_donor(donor_id) == general.remove_donor(donor_id)
                continue
            event = KvEvent(worker_id=key[0], event_id=event_ids[key], data=data)
            fast.apply(event)
            general.apply(event)
            assert fast.take_changes() == general.take_changes(), (seed, step)
            assert _counted(fast) == _counted(general), (seed, step)
            if step % 16 == 0:
                assert _observed(fast, keys, engine) == _observed(general, keys, engine), (seed, step)
        for key, blocks in fast._workers.items():
            assert list(blocks.by_block.items()) == list(general._workers[key].by_block.items())
            assert list(blocks.hashes.items()) == list(general._workers[key].hashes.items())
        assert fast.snapshot() == general.snapshot()
        assert fast.array_stores > 20, seed


@pytest.mark.parametrize("shared", [False, True])
def test_donors_one_stored_event_completes_turn_resident_in_the_order_of_their_last_blocks(shared: bool) -> None:
    """Donors of disjoint runs of a prompt (added in another order, so their slots are not in run order; with
    ``shared``, each run's first hash also another donor's) turn resident as their last hash arrives, as on the general
    path."""
    prompt = list(range(1, 201))
    fast, general = _CountedStores(capacity=100), _GeneralStores(capacity=100)
    runs = [3, 0, 7, 1, 9, 2, 5, 8, 4, 6]
    for r in (fast, general):
        for run in runs:
            r.add_donor(_donor(f"d{run}", W1, prompt[20 * run : 20 * run + 20]))
        if shared:
            r.add_donor(_donor("firsts", W1, prompt[::20]))
        r.apply(Events(W1).stored(*prompt))
    expected = [(f"d{run}", True) for run in range(10)]
    if shared:  # complete with the last run's first hash
        expected.insert(9, ("firsts", True))
    assert fast.take_changes() == general.take_changes() == expected
    assert fast.array_stores == 1
