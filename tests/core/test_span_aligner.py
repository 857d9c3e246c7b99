from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semblend_dynamo import _native
from semblend_dynamo.span_aligner import Span, SpanAligner, _IdTable
from tests.support.aligner_paths import aligner_paths


@pytest.fixture(
    autouse=True, scope="module", params=aligner_paths(), ids=lambda native: "native" if native else "numpy"
)
def aligner_path(request: pytest.FixtureRequest) -> Iterator[bool]:
    """Every test here runs on each path: aligners made without ``native=`` take the compiled core when loaded."""
    with pytest.MonkeyPatch.context() as patch:
        if not request.param:
            patch.setattr(_native, "LIBRARY", None)
        assert SpanAligner(block_size=1, min_span_tokens=1).native == request.param, _native.REASON
        yield request.param


def run(start: int, n: int) -> list[int]:
    """n distinct token ids starting at ``start`` (hand-checkable: no accidental matches)."""
    return list(range(start, start + n))


SYSTEM = run(1000, 32)
C1, C2, C3 = run(2000, 64), run(3000, 64), run(4000, 64)


def test_reordered_rag_prompt_yields_expected_spans_and_deltas() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    # donor: system [0,32) c1 [32,96) c2 [96,160) c3 [160,224) question [224,244)
    aligner.add_donor("d", "ns", SYSTEM + C1 + C2 + C3 + run(5000, 20))
    # target: system [0,32) c3 [32,96) c1 [96,160) c2 [160,224) new question
    spans = aligner.align("ns", SYSTEM + C3 + C1 + C2 + run(6000, 20))
    assert spans == [
        Span(donor_id="d", donor_start=0, target_start=0, length=32),
        Span(donor_id="d", donor_start=160, target_start=32, length=64),
        Span(donor_id="d", donor_start=32, target_start=96, length=128),  # c1+c2 stay adjacent: one span
    ]
    assert [s.delta for s in spans] == [0, -128, 64]
    assert spans[1].target_end == 96 and spans[1].donor_end == 224


@pytest.mark.parametrize(
    ("edit_at", "expected"),
    [
        (100, [(0, 0, 96), (112, 112, 144)]),  # edit inside block 6: blocks 6 is lost on both sides
        (96, [(0, 0, 96), (112, 112, 144)]),  # edit on a block's first token: that block is lost
        (5, [(16, 16, 240)]),  # edit in block 0: only block 0 is lost
        (255, [(0, 0, 240)]),  # edit in the last block
    ],
)
def test_one_token_edit_breaks_exactly_the_spans_it_should(edit_at: int, expected: list[tuple[int, int, int]]) -> None:
    donor = run(100, 256)
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("d", "ns", donor)
    target = list(donor)
    target[edit_at] = 99_999
    spans = aligner.align("ns", target)
    assert [(s.donor_start, s.target_start, s.length) for s in spans] == expected
    for s in spans:
        assert target[s.target_start : s.target_end] == donor[s.donor_start : s.donor_end]


def test_unaligned_target_offsets_are_trimmed_inward_and_donor_offsets_are_free() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("d", "ns", run(0, 7) + C1 + C2)  # C1 at donor offset 7: not block-aligned
    spans = aligner.align("ns", [9, 9, 9, 9, 9] + C1 + C2 + [8] * 3)
    # raw match: target [5, 133) <- donor [7, 135); trimmed to target blocks [16, 128)
    assert spans == [Span(donor_id="d", donor_start=18, target_start=16, length=112)]


def test_multi_donor_cover_of_a_prefix() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("a", "ns", SYSTEM + C1)
    aligner.add_donor("b", "ns", run(7000, 48) + C2 + C3)
    spans = aligner.align("ns", SYSTEM + C2 + C3 + run(9000, 40))
    assert spans == [
        Span(donor_id="a", donor_start=0, target_start=0, length=32),
        Span(donor_id="b", donor_start=48, target_start=32, length=128),
    ]
    assert [s.delta for s in spans] == [0, -16]


def test_cross_namespace_donors_never_match() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("tenant-a", "ns-a", C1 + C2)
    assert aligner.align("ns-b", C1 + C2 + [1]) == []
    aligner.add_donor("tenant-b", "ns-b", C2 + C3)
    spans = aligner.align("ns-b", C1 + C2 + C3)
    assert {s.donor_id for s in spans} == {"tenant-b"}
    # a candidate list naming another namespace's donor does not let it through
    assert aligner.align("ns-b", C1 + C2, candidates=["tenant-a"]) == []


def test_candidates_restrict_the_donors_considered() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("old", "ns", C1 + C2)
    aligner.add_donor("new", "ns", C1 + C2)
    assert [s.donor_id for s in aligner.align("ns", C1 + C2)] == ["new"]  # tie: the newest donor
    assert [s.donor_id for s in aligner.align("ns", C1 + C2, candidates={"old"})] == ["old"]
    assert aligner.align("ns", C1 + C2, candidates=[]) == []


def test_prefers_fewer_donors_and_max_spans() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("whole", "ns", C1 + run(8000, 16) + C2)
    aligner.add_donor("c2-only", "ns", C2)
    target = C1 + run(8500, 16) + C2
    spans = aligner.align("ns", target)
    assert [(s.donor_id, s.target_start, s.length) for s in spans] == [("whole", 0, 64), ("whole", 80, 64)]
    assert len(aligner.align("ns", target, max_spans=1)) == 1


def test_duplicate_id_replaces_and_remove_forgets() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("d", "ns", C1)
    aligner.add_donor("d", "ns", C2)
    assert len(aligner) == 1 and "d" in aligner
    assert aligner.align("ns", [*C1, 1]) == []
    assert [s.donor_id for s in aligner.align("ns", [*C2, 1])] == ["d"]
    tokens = aligner.donor_tokens("d")
    assert tokens is not None and list(tokens) == C2
    assert aligner.remove_donor("d") is True
    assert aligner.remove_donor("d") is False
    assert "d" not in aligner and aligner.donor_tokens("d") is None
    assert aligner.align("ns", [*C2, 1]) == []


def test_low_entropy_tokens_give_the_longest_exact_span() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    aligner.add_donor("zeros", "ns", [0] * 100)
    assert aligner.align("ns", [0] * 100) == [Span(donor_id="zeros", donor_start=0, target_start=0, length=96)]


def test_bad_input_is_rejected_or_yields_nothing() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    with pytest.raises(ValueError):
        aligner.add_donor("neg", "ns", [1, -5, 3])
    with pytest.raises(ValueError):
        SpanAligner(block_size=0, min_span_tokens=1)
    aligner.add_donor("short", "ns", [1, 2, 3])  # shorter than a chunk: kept, never matches
    assert "short" in aligner
    aligner.add_donor("d", "ns", C1)
    assert aligner.align("ns", []) == []
    assert aligner.align("ns", C1[:10]) == []
    assert aligner.align("unknown-namespace", C1) == []
    assert aligner.align("ns", np.array([*C1, 1], dtype=np.int32)) == [
        Span(donor_id="d", donor_start=0, target_start=0, length=64)
    ]


def test_anchor_shorter_than_block_finds_shorter_matches() -> None:
    coarse = SpanAligner(block_size=16, min_span_tokens=16)
    fine = SpanAligner(block_size=16, min_span_tokens=16, anchor_tokens=4)
    for a in (coarse, fine):
        a.add_donor("d", "ns", run(0, 3) + run(500, 24) + run(50, 10))
    target = run(900, 13) + run(500, 24) + run(950, 10)  # match: target [13, 37) <- donor [3, 27)
    assert coarse.align("ns", target) == []  # 24 tokens < block + anchor - 1 = 31: no full chunk inside
    assert fine.align("ns", target) == [Span(donor_id="d", donor_start=6, target_start=16, length=16)]


@settings(max_examples=60, deadline=None)
@given(
    donors=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=120), min_size=1, max_size=4),
    target=st.lists(st.integers(0, 3), min_size=0, max_size=160),
    copy=st.tuples(st.integers(0, 3), st.integers(0, 119), st.integers(0, 159)),
)
def test_spans_are_exact_aligned_disjoint_and_found(
    donors: list[list[int]], target: list[int], copy: tuple[int, int, int]
) -> None:
    """Whatever the input, every span is token-exact, block-aligned on the target, long enough, disjoint.

    A donor slice of >= 3 blocks pasted into the target must produce some coverage.
    """
    bs, min_span = 8, 16
    aligner = SpanAligner(block_size=bs, min_span_tokens=min_span)
    for i, tokens in enumerate(donors):
        aligner.add_donor(f"d{i}", "ns", tokens)
    aligner.add_donor("other", "other-ns", target)
    which, src, dst = copy
    donor = donors[which % len(donors)]
    pasted = donor[src : src + 3 * bs + bs]
    target = target[:dst] + pasted + target[dst:]
    spans = aligner.align("ns", target, max_spans=16)
    end = -1
    for s in spans:
        assert s.donor_id != "other"
        tokens = donors[int(s.donor_id[1:])]
        assert target[s.target_start : s.target_end] == tokens[s.donor_start : s.donor_end]
        assert s.target_start % bs == 0 and s.target_end % bs == 0
        assert s.length >= min_span
        assert s.target_start >= end
        end = s.target_end
    if len(pasted) >= 4 * bs:
        assert spans, "a pasted run of 4 blocks must be found"


def test_filter_survives_growth_and_removals() -> None:
    aligner = SpanAligner(block_size=16, min_span_tokens=32)
    rng = np.random.default_rng(1)
    donors = {f"d{i}": rng.integers(0, 50_000, 96).tolist() for i in range(300)}  # 6 chunks each: filter grows
    for donor_id, tokens in donors.items():
        aligner.add_donor(donor_id, "ns", tokens)
    for i in range(0, 300, 2):
        aligner.remove_donor(f"d{i}")
    for i in (1, 2, 151, 298, 299):
        spans = aligner.align("ns", donors[f"d{i}"] + [1])
        assert [s.donor_id for s in spans] == ([f"d{i}"] if i % 2 else [])


@pytest.mark.parametrize("u32", [False, True])
def test_a_read_only_donor_array_of_the_aligners_width_is_shared_anything_else_copied(u32: bool) -> None:
    width, other = (np.uint32, np.int64) if u32 else (np.int64, np.uint32)
    frozen = np.arange(64, dtype=width)
    frozen.flags.writeable = False
    writable = np.arange(64, dtype=width)
    narrow = np.arange(64, dtype=other)
    narrow.flags.writeable = False
    al = SpanAligner(8, 8, tokens_u32=u32)
    al.add_donor("frozen", "ns", frozen)
    al.add_donor("writable", "ns", writable)
    al.add_donor("other width", "ns", narrow)
    assert np.shares_memory(al.donor_tokens("frozen"), frozen)  # type: ignore[arg-type]
    assert not np.shares_memory(al.donor_tokens("writable"), writable)  # type: ignore[arg-type]
    assert al.donor_tokens("other width").dtype == width  # type: ignore[union-attr]
    writable[:] = 0  # the caller's array changes; the indexed copy does not
    assert [s.length for s in al.align("ns", np.arange(64, dtype=width))] == [64]


def test_id_table_agrees_with_a_dict_through_growth_removals_and_reuse() -> None:
    """The vectorized chunk-id table the request path probes answers as the dict it mirrors does."""
    rng = np.random.default_rng(5)
    table, mirror = _IdTable(), {}
    pool = rng.integers(0, 1 << 63, 20_000, dtype=np.int64).view(np.uint64)
    pool[:64] = pool[0] ^ np.arange(64, dtype=np.uint64)  # hashes that share a bucket's neighbourhood
    next_id = 0
    for _ in range(60):
        absent = np.array([h for h in rng.choice(pool, 600).tolist() if h not in mirror], dtype=np.uint64)
        absent = np.unique(absent)
        ids = np.arange(next_id, next_id + absent.size)
        next_id += absent.size
        mirror.update(zip(absent.tolist(), ids.tolist(), strict=True))
        table.insert(absent, ids, len(mirror))
        present = list(mirror)
        gone = np.array(rng.choice(present, min(len(present), 250), replace=False), dtype=np.uint64)
        for h in gone.tolist():
            del mirror[h]
        table.remove(gone)
        assert table.find(pool).tolist() == [mirror.get(h, -1) for h in pool.tolist()]
