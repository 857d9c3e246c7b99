"""The chunk filter's two bits a hash: the bitset holds exactly the live hashes' slots, the screen is the two-bit rule,
nothing indexed is screened out, and the compiled core screens the same windows (same spans as the numpy path)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semblend_dynamo import _native
from semblend_dynamo.span_aligner import _MIX, SpanAligner, _ChunkTable

_U64 = (1 << 64) - 1


def _two_slots(h: int, bits: int) -> tuple[int, int]:
    """The rule, in Python ints: the mixed hash's top ``bits`` bits, and the next 9 bits within the first's 512."""
    mixed = (h * int(_MIX)) & _U64
    first = mixed >> (64 - bits)
    second = (first & ~511) | ((mixed >> (64 - bits - 9)) & 511)
    return first, second


def _reference_bits(table: _ChunkTable) -> set[int]:
    bits = 64 - int(table._shift)
    return {slot for h in table.postings for slot in _two_slots(h, bits)}


def _set_bits(table: _ChunkTable) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(table._bits, bitorder="little")).tolist())


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    donors=st.integers(1, 60),
    removed=st.integers(0, 60),
    vocabulary=st.sampled_from([3, 50, 50_000]),
)
def test_the_bitset_is_the_live_hashes_two_slots_and_the_screen_is_the_two_bit_rule(
    seed: int, donors: int, removed: int, vocabulary: int
) -> None:
    rng = np.random.default_rng(seed)
    aligner = SpanAligner(block_size=8, min_span_tokens=16, native=False)
    tokens = {f"d{i}": rng.integers(0, vocabulary, int(rng.integers(8, 200))).tolist() for i in range(donors)}
    for donor_id, toks in tokens.items():
        aligner.add_donor(donor_id, "ns", toks)
    for donor_id in list(tokens)[: min(removed, donors - 1)]:
        aligner.remove_donor(donor_id)
    table = aligner._tables["ns"]
    assert _set_bits(table) == _reference_bits(table)  # a bit is cleared once no live hash needs it
    target = np.concatenate(
        [rng.integers(0, vocabulary, 300), np.array(tokens[f"d{donors - 1}"], dtype=np.int64)]
    ).astype(np.int64)
    sums, powers = aligner._window_sums(target)
    screened = table.screen(sums, powers.inv_mix[: sums.size]).tolist()
    bits = 64 - int(table._shift)
    live = _set_bits(table)
    hashes = aligner._window_hashes(target).tolist()
    expected = [i for i, h in enumerate(hashes) if set(_two_slots(int(h), bits)) <= live]
    assert screened == expected
    indexed = set(table.postings)
    assert {i for i, h in enumerate(hashes) if int(h) in indexed} <= set(screened)  # no false negatives


def test_the_second_bit_screens_out_most_of_the_first_bits_false_positives() -> None:
    """10K chunks against a 32-slot-per-chunk filter: one bit lets ~1/50 of foreign windows through, two ~1/600."""
    rng = np.random.default_rng(3)
    aligner = SpanAligner(block_size=32, min_span_tokens=64, native=False)
    for i in range(40):
        aligner.add_donor(f"d{i}", "ns", rng.integers(1, 32_000, 8192).tolist())
    table = aligner._tables["ns"]
    target = rng.integers(1, 32_000, 8192)  # no chunk of any donor
    sums, powers = aligner._window_sums(target)
    two_bits = table.screen(sums, powers.inv_mix[: sums.size]).size
    bits = 64 - int(table._shift)
    live = _set_bits(table)
    one_bit = sum(_two_slots(int(h), bits)[0] in live for h in aligner._window_hashes(target).tolist())
    assert one_bit > 60
    assert two_bits * 4 < one_bit


@pytest.mark.skipif(_native.disabled(), reason="compiled aligner turned off")
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), u32=st.booleans(), vocabulary=st.sampled_from([4, 64, 32_000]))
def test_the_compiled_screen_lets_the_same_windows_through(seed: int, u32: bool, vocabulary: int) -> None:
    """Spans equal between the paths on targets whose matches sit anywhere, with many chunks passing the first bit
    (a small vocabulary: repeated windows): a window the compiled screen dropped or kept alone would show."""
    rng = np.random.default_rng(seed)
    paths = [SpanAligner(8, 16, tokens_u32=u32, native=native) for native in (False, True)]
    donors = [rng.integers(0, vocabulary, int(rng.integers(16, 400))).tolist() for _ in range(int(rng.integers(1, 30)))]
    for k, toks in enumerate(donors):
        for aligner in paths:
            aligner.add_donor(f"d{k}", "ns", toks)
    pick = donors[int(rng.integers(0, len(donors)))]
    cut = int(rng.integers(0, len(pick)))
    target = rng.integers(0, vocabulary, int(rng.integers(0, 90))).tolist() + pick[cut:] + pick[:cut]
    results = [aligner.align("ns", target) for aligner in paths]
    assert results[0] == results[1]
