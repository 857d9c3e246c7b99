"""The compiled core's single call (``sa_align``: hits, shared postings, diagonals, windows, runs, greedy cover) returns
exactly the numpy path's spans, at scale, on both token widths.

The hypothesis test in test_span_aligner_reference.py covers small tables against the previous implementation; this
one builds hundreds of donors per round where chunks are shared by more donors than ``max_postings`` (a common system
prompt, copies of one text at several offsets), releases and replaces donors between alignments (the shared postings'
arrays shift and shrink, slots and key ids are reused), restricts the donors to random allowed sets, and makes targets
whose runs overlap on the target (so the greedy cover clips). It checks that those cases did occur.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from semblend_dynamo import _native
from semblend_dynamo.span_aligner import SpanAligner, _Candidate, _IdTable

pytestmark = pytest.mark.skipif(_native.LIBRARY is None, reason=f"native core not loaded: {_native.REASON}")


def _pair(u32: bool, **settings: int) -> tuple[SpanAligner, SpanAligner]:
    return (
        SpanAligner(**settings, native=False, tokens_u32=u32),  # type: ignore[arg-type]
        SpanAligner(**settings, native=True, tokens_u32=u32),  # type: ignore[arg-type]
    )


def _donor_array(tokens: np.ndarray, u32: bool) -> np.ndarray:
    out = tokens.astype(np.uint32 if u32 else np.int64)
    out.flags.writeable = False  # as the connector's registry hands them over (shared, not copied)
    return out


def _overlapping(candidates: list[_Candidate]) -> bool:
    ordered = sorted(candidates, key=lambda c: c.start)
    return any(a.end > b.start for a, b in itertools.pairwise(ordered))


@pytest.mark.parametrize("u32", [False, True], ids=["int64", "uint32"])
@pytest.mark.parametrize("seed", range(4))
def test_one_call_equals_the_numpy_path_at_scale(u32: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    block = int(rng.choice([8, 16, 32]))
    settings = dict(
        block_size=block,
        min_span_tokens=block * int(rng.integers(1, 3)),
        anchor_tokens=int(rng.choice([block, block // 2 + 1])),
        max_postings=int(rng.integers(1, 5)),
        max_diagonals=int(rng.choice([3, 16, 64])),
    )
    numpy_path, native_path = _pair(u32, **settings)
    vocab = int(rng.choice([40, 3000]))
    system = rng.integers(0, vocab, 6 * block)
    text = rng.integers(0, vocab, 40 * block)  # copies of it at several offsets: overlapping diagonals
    donors: dict[str, np.ndarray] = {}
    next_id = itertools.count()

    def admit() -> None:
        kind = rng.random()
        body = rng.integers(0, vocab, int(rng.integers(block, 30 * block)))
        if kind < 0.3:
            tokens = np.concatenate([system, body])
        elif kind < 0.6:
            start = int(rng.integers(0, text.size - 8 * block))
            tokens = np.concatenate([text[start : start + int(rng.integers(8 * block, 20 * block))], body[:block]])
        else:
            tokens = body
        donor_id = f"d{next(next_id)}" if rng.random() > 0.1 or not donors else str(rng.choice(list(donors)))
        for aligner in (numpy_path, native_path):
            aligner.add_donor(donor_id, "ns", _donor_array(tokens, u32))
        donors[donor_id] = tokens

    for _ in range(300):
        admit()
    seen = {"shared beyond max_postings": 0, "overlapping candidates": 0, "allowed": 0, "spans": 0}
    for round_ in range(60):
        for _ in range(int(rng.integers(0, 12))):  # churn: releases from anywhere in the postings lists, admissions
            if donors and rng.random() < 0.5:
                gone = str(rng.choice(list(donors)))
                assert numpy_path.remove_donor(gone) and native_path.remove_donor(gone)
                donors.pop(gone)
            else:
                admit()
        pool = list(donors.values())
        parts: list[np.ndarray] = [system] if rng.random() < 0.5 else []
        while sum(p.size for p in parts) < 2000:
            source = text if rng.random() < 0.4 else pool[int(rng.integers(len(pool)))]
            start = int(rng.integers(0, max(1, source.size - 2 * block)))
            parts.append(source[start : start + int(rng.integers(block, 12 * block))])
            parts.append(rng.integers(0, vocab, int(rng.integers(0, 3))))
        target = np.concatenate(parts).astype(numpy_path.dtype)
        candidates = None
        if round_ % 3 == 1:
            candidates = [str(d) for d in rng.choice(list(donors), size=int(rng.integers(1, 40)), replace=False)]
            candidates.append("unknown")
            seen["allowed"] += 1
        max_spans = int(rng.choice([1, 3, 8, 64]))
        expected = numpy_path.align("ns", target, candidates=candidates, max_spans=max_spans)
        assert native_path.align("ns", target, candidates=candidates, max_spans=max_spans) == expected
        seen["spans"] += len(expected)
        table = numpy_path._tables["ns"]
        if any(len(p) > settings["max_postings"] for p in table.postings.values()):
            seen["shared beyond max_postings"] += 1
        allowed = numpy_path._allowed_serials("ns", candidates)
        if _overlapping(numpy_path._candidates(table, target, allowed)):
            seen["overlapping candidates"] += 1
    assert all(seen.values()), seen


@pytest.mark.parametrize("u32", [False, True], ids=["int64", "uint32"])
def test_the_shared_postings_arrays_mirror_the_lists_through_churn(u32: bool) -> None:
    """Each chunk several donors share has an array equal to its postings list, a chunk of one donor none: through
    admissions, releases from the middle of lists, replacements, and donors repeating a chunk."""
    rng = np.random.default_rng(3)
    _, aligner = _pair(u32, block_size=4, min_span_tokens=4, max_postings=2)
    system = rng.integers(0, 50, 16)
    live: list[str] = []
    for i in range(400):
        if live and rng.random() < 0.4:
            gone = live.pop(int(rng.integers(len(live))))
            assert aligner.remove_donor(gone)
        else:
            body = rng.integers(0, 50, int(rng.integers(4, 40)))
            tokens = np.concatenate([system, body, system] if i % 3 == 0 else [body, system[:8]])
            donor_id = f"d{i % 150}"
            aligner.add_donor(donor_id, "ns", _donor_array(tokens, u32))
            if donor_id not in live:
                live.append(donor_id)
        table = aligner._tables.get("ns")
        if table is None:
            continue
        for h, postings in table.postings.items():
            key = table.ids[h]
            if len(postings) == 1:
                assert key not in table._shared and table.single_serial[key] >= 0
                continue
            count = int(table.shared_count[key])
            mirror = table._shared[key]
            assert table.single_serial[key] == -1 and mirror[:count].tolist() == postings
            assert table.shared_at[key] == mirror.__array_interface__["data"][0]
        assert set(table._shared) <= set(table.ids.values())


@pytest.mark.parametrize("u32", [False, True], ids=["int64", "uint32"])
@pytest.mark.parametrize("left", [24, 20, 28])
@pytest.mark.parametrize("right", [72, 76, 68])
def test_clipped_pieces_at_the_minimum_length(u32: bool, left: int, right: int) -> None:
    """The longest span (32..64) clips two shorter ones that overlap it by 8 tokens: what is left of each is kept when
    it is at least min_span_tokens (8) long, exactly at the bound included, and dropped when shorter."""
    text = np.random.default_rng(5).integers(0, 30_000, 96)
    numpy_path, native_path = _pair(u32, block_size=4, min_span_tokens=8)
    for donor_id, (start, end) in {"best": (32, 64), "left": (left, 40), "right": (56, right)}.items():
        for aligner in (numpy_path, native_path):
            aligner.add_donor(donor_id, "ns", _donor_array(text[start:end], u32))
    target = text.astype(numpy_path.dtype)
    expected = [(s.donor_id, s.target_start, s.target_end) for s in numpy_path.align("ns", target)]
    pieces = [("left", left, 32)] if 32 - left >= 8 else []
    pieces += [("best", 32, 64)] + ([("right", 64, right)] if right - 64 >= 8 else [])
    assert expected == pieces
    assert native_path.align("ns", target) == numpy_path.align("ns", target)


def test_the_one_key_id_table_operations_agree_with_a_dict() -> None:
    """The donor book's serial -> slot table: one key at a time (probed in Python), mixed with the vectorized calls,
    through rebuilds, removals and reused entries; consecutive serials and keys above 2**63 alike."""
    rng = np.random.default_rng(9)
    table, mirror = _IdTable(), {}
    keys = [*range(3000), *(2 * int(k) + 1 for k in rng.integers(1 << 62, 1 << 63, 1000, dtype=np.int64))]
    for step, key in enumerate(keys):
        if key in mirror:
            continue
        mirror[key] = step
        if step % 5 == 0:
            table.insert(np.array([key], dtype=np.uint64), np.array([step], dtype=np.int64), len(mirror))
        else:
            table.insert_one(key, step, len(mirror))
        if step % 3 == 0:
            gone = list(mirror)[int(rng.integers(len(mirror)))]
            del mirror[gone]
            table.remove_one(gone)
        table.remove_one((1 << 64) - 1)  # not in the table: nothing happens
    probe = np.array([*keys, 5000, (1 << 64) - 1], dtype=np.uint64)
    assert table.find(probe).tolist() == [mirror.get(k, -1) for k in probe.tolist()]


@pytest.mark.parametrize("u32", [False, True], ids=["int64", "uint32"])
def test_every_target_length_and_match_position_across_the_screens_stretches(u32: bool) -> None:
    """The compiled screen rolls four hashes over four stretches of the target and screens the last few windows on
    their own: targets of every length from one window to a few hundred, with a donor's text at every stretch's
    start, middle and end, and alone in the windows past the stretches, find what the numpy path finds."""
    text = np.random.default_rng(2).integers(0, 30_000, 64)
    numpy_path, native_path = _pair(u32, block_size=4, min_span_tokens=8, anchor_tokens=6)
    for aligner in (numpy_path, native_path):
        aligner.add_donor("d", "ns", _donor_array(text, u32))
    filler = np.random.default_rng(3).integers(30_000, 60_000, 400)
    found = 0
    for n in range(6, 260, 3):
        windows = n - 6 + 1
        stretch = windows // 4
        for at in {0, stretch, 2 * stretch - 3, 3 * stretch + 1, 4 * stretch, windows - 1, n - 12}:
            for length in (6, 12, 17):
                if at < 0 or at + length > n:
                    continue
                target = filler[:n].copy()
                target[at : at + length] = text[5 : 5 + length]
                target = target.astype(numpy_path.dtype)
                expected = numpy_path.align("ns", target)
                assert native_path.align("ns", target) == expected, (n, at, length)
                found += bool(expected)
    assert found > 100


@pytest.mark.parametrize("u32", [False, True], ids=["int64", "uint32"])
def test_a_run_ending_at_every_offset_of_the_word_compare(u32: bool) -> None:
    """The compiled core compares a diagonal 16 bytes at a time (2 or 4 tokens) and finds the first differing token in
    the word: a match that ends at each token offset, in the first or second half of a word, starting at several
    offsets, has the right length (blocks of one token: nothing trimmed)."""
    text = np.random.default_rng(4).integers(0, 30_000, 200)
    numpy_path, native_path = _pair(u32, block_size=1, min_span_tokens=8, anchor_tokens=8)
    for aligner in (numpy_path, native_path):
        aligner.add_donor("d", "ns", _donor_array(text, u32))
    for end in range(40, 80):
        for shift in (0, 1, 2, 3):
            target = np.concatenate((text[shift:end], text[end:] + 1)).astype(numpy_path.dtype)
            [span] = numpy_path.align("ns", target)
            assert (span.donor_start, span.target_start, span.length) == (shift, 0, end - shift)
            assert native_path.align("ns", target) == [span]


def test_a_filter_larger_than_the_caches_is_screened_with_its_bytes_prefetched() -> None:
    """A filter of more than 1 MiB (the compiled screen's SCREEN_PREFETCH_BYTES) is screened by the loop that prefetches
    each window's filter byte ahead of its test: targets of every stretch length around the 16 windows it hashes ahead,
    with donor text at the stretches' edges, find what the numpy path finds."""
    numpy_path, native_path = _pair(True, block_size=4, min_span_tokens=8, anchor_tokens=6)
    big = np.random.default_rng(5).integers(0, 1 << 30, 1_200_000)
    for aligner in (numpy_path, native_path):
        aligner.add_donor("big", "ns", _donor_array(big, True))
    assert native_path._tables["ns"]._bits.nbytes > 1 << 20
    filler = np.random.default_rng(6).integers(1 << 30, 1 << 31, 400)
    found = 0
    for n in (*range(6, 90, 5), 150, 260, 400):
        windows = n - 6 + 1
        stretch = windows // 4
        for at in {0, stretch - 1, 2 * stretch + 5, 3 * stretch, windows - 1, n - 17}:
            if at < 0 or at + 17 > n:
                continue
            target = filler[:n].copy()
            target[at : at + 17] = big[1000 + 7 * at : 1000 + 7 * at + 17]
            target = target.astype(np.uint32)
            expected = numpy_path.align("ns", target)
            assert native_path.align("ns", target) == expected, (n, at)
            found += bool(expected)
    assert found > 30


@pytest.mark.parametrize("u32", [False, True], ids=["int64", "uint32"])
def test_a_chunk_at_every_bit_of_a_filter_word_passes_the_screen(u32: bool) -> None:
    """The compiled screen reads the filter 64 bits at a time (where bytes are little-endian) and tests a chunk's two
    bits in their words: a donor of hundreds of chunks, whose first and second bits fall at every offset of a word,
    has each chunk found alone (a target holding one chunk, the one window that can pass), as the numpy path finds
    it, and nothing found in a target of other tokens."""
    numpy_path, native_path = _pair(u32, block_size=4, min_span_tokens=4, anchor_tokens=4)
    text = np.random.default_rng(7).integers(0, 30_000, 4 * 600)
    for aligner in (numpy_path, native_path):
        aligner.add_donor("d", "ns", _donor_array(text, u32))
    table = native_path._tables["ns"]
    hashes = numpy_path._window_hashes(text.astype(numpy_path.dtype))[::4]
    slots = table.slots(hashes)
    first, second = slots[: hashes.size], slots[hashes.size :]
    assert set((first % 64).tolist()) == set(range(64)) == set((second % 64).tolist())
    filler = np.random.default_rng(8).integers(30_000, 60_000, 16)
    for j in range(hashes.size):
        target = filler.copy()
        target[8:12] = text[4 * j : 4 * j + 4]
        target = target.astype(numpy_path.dtype)
        expected = numpy_path.align("ns", target)
        assert [(s.donor_start, s.target_start, s.length) for s in expected] == [(4 * j, 8, 4)], j
        assert native_path.align("ns", target) == expected, j
    assert native_path.align("ns", filler.astype(numpy_path.dtype)) == []


@pytest.mark.parametrize("u32", [False, True], ids=["int64", "uint32"])
def test_a_target_whose_every_window_is_a_chunk_on_every_stretch(u32: bool) -> None:
    """The compiled screen asks for a passing window's id-table bucket as it passes and the lookups follow the screen:
    targets in which every window of every stretch passes (chunks at every donor offset, many donors, so buckets
    overflow into their neighbours), copied from one donor or stitched from several at shifted offsets, find what the
    numpy path finds."""
    numpy_path, native_path = _pair(u32, block_size=1, min_span_tokens=8, anchor_tokens=3, max_diagonals=16)
    rng = np.random.default_rng(9)
    texts = [rng.integers(0, 5_000, 300) for _ in range(20)]
    for i, text in enumerate(texts):
        for aligner in (numpy_path, native_path):
            aligner.add_donor(f"d{i}", "ns", _donor_array(text, u32))
    buckets = native_path._tables["ns"].id_table.ids
    assert (buckets >= 0).all(axis=1).any()  # some buckets are full: lookups probe the next ones
    for n in (3, 4, 11, 64, 257, 300):
        for parts in (1, 3):
            pieces = [texts[(n + k) % len(texts)][5 * k : 5 * k + n // parts + 9] for k in range(parts)]
            target = np.concatenate(pieces)[:n].astype(numpy_path.dtype)
            expected = numpy_path.align("ns", target, max_spans=4)
            assert native_path.align("ns", target, max_spans=4) == expected, (n, parts)
            assert expected or n < 8
