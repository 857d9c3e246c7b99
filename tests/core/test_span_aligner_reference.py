"""The span aligner returns exactly what its previous implementation returned (tests/support/reference_aligner.py),
on both of its paths, numpy and the compiled core (``semblend_dynamo._native``), and at both token widths (int64, the
router's; uint32, the connector's).

Its lookups changed (window sums instead of a prefix sum, a byte filter, sorted chunk hashes read vectorized, the
postings loop only for chunks several donors share, then the same steps in C); its answers must not.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semblend_dynamo.span_aligner import SpanAligner
from tests.support.aligner_paths import aligner_paths
from tests.support.reference_aligner import ReferenceSpanAligner


def spans_of(
    aligner: SpanAligner, namespace: str, target: list[int], **kwargs: object
) -> list[tuple[str, int, int, int]]:
    return [(s.donor_id, s.donor_start, s.target_start, s.length) for s in aligner.align(namespace, target, **kwargs)]  # type: ignore[arg-type]


class Aligners:
    """One SpanAligner per path and token width and the reference, fed the same donors; ``check`` asserts they all
    agree (a uint32 aligner is given its donors and targets as uint32 arrays, as the connector does)."""

    def __init__(self, **kwargs: int | None) -> None:
        self.paths = [
            SpanAligner(**kwargs, native=native, tokens_u32=u32)  # type: ignore[arg-type]
            for native in aligner_paths()
            for u32 in (False, True)
        ]
        self.reference = ReferenceSpanAligner(**kwargs)  # type: ignore[arg-type]

    def add_donor(self, donor_id: str, namespace: str, tokens: list[int]) -> None:
        for aligner in (*self.paths, self.reference):
            aligner.add_donor(donor_id, namespace, _frozen_u32(tokens) if _u32(aligner) else tokens)

    def remove_donor(self, donor_id: str) -> bool:
        removed = {aligner.remove_donor(donor_id) for aligner in (*self.paths, self.reference)}
        assert len(removed) == 1
        return removed.pop()

    def check(self, namespace: str, target: list[int], **kwargs: object) -> list[tuple[str, int, int, int]]:
        expected = self.reference.align(namespace, target, **kwargs)  # type: ignore[arg-type]
        for aligner in self.paths:
            given = np.array(target, dtype=np.uint32) if aligner.dtype == np.uint32 else target
            found = spans_of(aligner, namespace, given, **kwargs)  # type: ignore[arg-type]
            assert found == expected, f"native={aligner.native}, {aligner.dtype}"
        return expected


def _u32(aligner: SpanAligner | ReferenceSpanAligner) -> bool:
    return isinstance(aligner, SpanAligner) and aligner.dtype == np.uint32


def _frozen_u32(tokens: list[int]) -> np.ndarray:
    """The donor registry's copy: a read-only uint32 array that owns its memory (the aligner shares it)."""
    out = np.array(tokens, dtype=np.uint32)
    out.flags.writeable = False
    return out


def mosaic(rng: random.Random, donors: list[list[int]], n: int, vocab: int) -> list[int]:
    """A target of donor slices (any offset) and fresh tokens."""
    out: list[int] = []
    while len(out) < n:
        if donors and rng.random() < 0.7:
            donor = rng.choice(donors)
            start = rng.randrange(len(donor) + 1)
            out += donor[start : start + rng.randrange(1, 80)]
        else:
            out += [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
    return out[:n]


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    block_size=st.sampled_from([4, 8, 16]),
    anchor=st.sampled_from([None, 1, 3, 5, 8, 12]),
    min_blocks=st.integers(1, 3),
    vocab=st.sampled_from([2, 4, 50, 30_000]),
    max_postings=st.integers(1, 4),
    max_diagonals=st.sampled_from([1, 3, 64]),
    max_spans=st.integers(1, 8),
)
def test_same_spans_as_the_reference_aligner(
    seed: int,
    block_size: int,
    anchor: int | None,
    min_blocks: int,
    vocab: int,
    max_postings: int,
    max_diagonals: int,
    max_spans: int,
) -> None:
    """Donors that share chunks (copies, small vocabularies), replaced and removed donors, candidates, every cap."""
    rng = random.Random(seed)
    settings_ = dict(
        block_size=block_size,
        min_span_tokens=min_blocks * block_size,
        anchor_tokens=anchor,
        max_postings=max_postings,
        max_diagonals=max_diagonals,
    )
    aligners = Aligners(**settings_)
    donors: dict[str, list[int]] = {}
    for i in range(rng.randrange(1, 9)):
        base = list(rng.choice(list(donors.values()))) if donors and rng.random() < 0.4 else []
        tokens = base[: rng.randrange(len(base) + 1)] + [rng.randrange(vocab) for _ in range(rng.randrange(0, 200))]
        donor_id = f"d{rng.randrange(6)}" if rng.random() < 0.3 else f"d{i}"  # sometimes replaces a donor
        namespace = "other" if rng.random() < 0.15 else "ns"
        aligners.add_donor(donor_id, namespace, tokens)
        donors[donor_id] = tokens
        if rng.random() < 0.2:
            gone = rng.choice(list(donors))
            assert aligners.remove_donor(gone)
            donors.pop(gone)
    pool = list(donors.values())
    for _ in range(4):
        target = mosaic(rng, pool, rng.randrange(0, 260), vocab)
        candidates = None if rng.random() < 0.6 else rng.sample([*donors, "unknown"], rng.randrange(0, len(donors) + 1))
        for namespace in ("ns", "other"):
            aligners.check(namespace, target, candidates=candidates, max_spans=max_spans)


def test_same_spans_at_scale_through_filter_growth_and_removals() -> None:
    """Hundreds of donors of 2K tokens sharing a system prompt: the filter grows, half the donors go, others come."""
    aligners = Aligners(block_size=32, min_span_tokens=32)
    rng = np.random.default_rng(7)
    system = rng.integers(1, 32_000, 512).tolist()
    donors = {f"d{i}": (system if i % 3 == 0 else []) + rng.integers(1, 32_000, 2048).tolist() for i in range(300)}
    for donor_id, tokens in donors.items():
        aligners.add_donor(donor_id, "ns", tokens)
    for i in range(0, 300, 2):
        aligners.remove_donor(f"d{i}")
    for i in range(300, 400):  # reuse the freed key ids
        tokens = rng.integers(1, 32_000, 1024).tolist() + donors[f"d{i - 299}"][:700]
        donors[f"d{i}"] = tokens
        aligners.add_donor(f"d{i}", "ns", tokens)
    for i in range(1, 300, 2):
        donors.pop(f"d{i - 1}", None)
    pick = random.Random(3)
    for _ in range(40):
        a, b = pick.sample(list(donors.values()), 2)
        shift = pick.randrange(0, 100)
        target = a[shift : shift + 1500] + rng.integers(1, 32_000, 100).tolist() + b[200:900]
        aligners.check("ns", target)
        aligners.check("ns", target, candidates=["d1", "d3", "d4"])


def test_same_spans_while_the_tables_grow_between_requests() -> None:
    """Alignments between admissions and releases: the filter and the id table are rebuilt and the per-chunk arrays
    grow (new addresses for the compiled core) while the targets keep hitting old and new donors, shifted."""
    aligners = Aligners(block_size=16, min_span_tokens=32, max_postings=2)
    rng = np.random.default_rng(11)
    system = rng.integers(0, 5_000, 96).tolist()
    donors: dict[str, list[int]] = {}
    for i in range(120):
        tokens = (system if i % 4 == 0 else []) + rng.integers(0, 5_000, int(rng.integers(40, 600))).tolist()
        donors[f"d{i}"] = tokens
        aligners.add_donor(f"d{i}", "ns", tokens)
        if i % 7 == 6:
            gone = f"d{i - 5}"
            aligners.remove_donor(gone)
            donors.pop(gone)
        pool = list(donors.values())
        a, b = pool[int(rng.integers(len(pool)))], pool[-1]
        cut = int(rng.integers(0, 40))
        target = a[cut:] + rng.integers(0, 5_000, 7).tolist() + b + system
        aligners.check("ns", target)
        aligners.check("ns", target, candidates=list(donors)[-3:])


@pytest.mark.parametrize("size", [0, 1, 7, 8, 15, 16, 17, 31, 32, 33])
def test_same_spans_at_the_edge_sizes(size: int) -> None:
    """Targets and donors as short as one window (anchor 8, min span 16) or one token over; one-token vocabularies."""
    aligners = Aligners(block_size=8, min_span_tokens=16, max_diagonals=2)
    aligners.add_donor("ones", "ns", [1] * size)
    aligners.add_donor("count", "ns", list(range(size)))
    aligners.add_donor("ones-again", "ns", [1] * (size + 3))
    for target in ([1] * size, list(range(size)), [1] * (size + 9), [0, *range(size)], list(range(1, size + 1))):
        for max_spans in (1, 8):
            aligners.check("ns", target, max_spans=max_spans)
            aligners.check("ns", target, candidates=["ones"], max_spans=max_spans)


def test_same_spans_for_targets_of_changing_length() -> None:
    """The compiled core's work buffer is kept between alignments: a long target, then shorter ones (the buffer holds
    the earlier scan's rows past what they write), then longer ones again (it grows) give the reference's spans."""
    rng = random.Random(5)
    aligners = Aligners(block_size=8, min_span_tokens=16, max_postings=2)
    donors = [[rng.randrange(60) for _ in range(rng.randrange(40, 400))] for _ in range(12)]
    shared = [rng.randrange(60) for _ in range(48)]  # chunks several donors share: the postings path
    for i, tokens in enumerate(donors):
        aligners.add_donor(f"d{i}", "ns", shared + tokens if i % 3 == 0 else tokens)
    for n in (600, 40, 600, 17, 250, 1200, 33, 1200):
        aligners.check("ns", shared + mosaic(rng, donors, n, 60))
        aligners.check("ns", mosaic(rng, donors, n, 60), candidates=["d0", "d4"])
