"""The span aligner returns exactly what its previous implementation returned (tests/support/reference_aligner.py).

Its lookups changed (window sums instead of a prefix sum, a byte filter, sorted chunk hashes read vectorized, the
postings loop only for chunks several donors share); its answers must not.
"""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from semblend_dynamo.span_aligner import SpanAligner
from tests.support.reference_aligner import ReferenceSpanAligner


def spans_of(
    aligner: SpanAligner, namespace: str, target: list[int], **kwargs: object
) -> list[tuple[str, int, int, int]]:
    return [(s.donor_id, s.donor_start, s.target_start, s.length) for s in aligner.align(namespace, target, **kwargs)]  # type: ignore[arg-type]


def pair(**kwargs: int | None) -> tuple[SpanAligner, ReferenceSpanAligner]:
    return SpanAligner(**kwargs), ReferenceSpanAligner(**kwargs)  # type: ignore[arg-type]


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
    new, old = pair(**settings_)
    donors: dict[str, list[int]] = {}
    for i in range(rng.randrange(1, 9)):
        base = list(rng.choice(list(donors.values()))) if donors and rng.random() < 0.4 else []
        tokens = base[: rng.randrange(len(base) + 1)] + [rng.randrange(vocab) for _ in range(rng.randrange(0, 200))]
        donor_id = f"d{rng.randrange(6)}" if rng.random() < 0.3 else f"d{i}"  # sometimes replaces a donor
        namespace = "other" if rng.random() < 0.15 else "ns"
        new.add_donor(donor_id, namespace, tokens)
        old.add_donor(donor_id, namespace, tokens)
        donors[donor_id] = tokens
        if rng.random() < 0.2:
            gone = rng.choice(list(donors))
            assert new.remove_donor(gone) == old.remove_donor(gone)
            donors.pop(gone)
    pool = list(donors.values())
    for _ in range(4):
        target = mosaic(rng, pool, rng.randrange(0, 260), vocab)
        candidates = None if rng.random() < 0.6 else rng.sample([*donors, "unknown"], rng.randrange(0, len(donors) + 1))
        for namespace in ("ns", "other"):
            expected = old.align(namespace, target, candidates=candidates, max_spans=max_spans)
            assert spans_of(new, namespace, target, candidates=candidates, max_spans=max_spans) == expected


def test_same_spans_at_scale_through_filter_growth_and_removals() -> None:
    """Hundreds of donors of 2K tokens sharing a system prompt: the filter grows, half the donors go, others come."""
    new, old = pair(block_size=32, min_span_tokens=32)
    rng = np.random.default_rng(7)
    system = rng.integers(1, 32_000, 512).tolist()
    donors = {f"d{i}": (system if i % 3 == 0 else []) + rng.integers(1, 32_000, 2048).tolist() for i in range(300)}
    for donor_id, tokens in donors.items():
        new.add_donor(donor_id, "ns", tokens)
        old.add_donor(donor_id, "ns", tokens)
    for i in range(0, 300, 2):
        new.remove_donor(f"d{i}")
        old.remove_donor(f"d{i}")
    for i in range(300, 400):  # reuse the freed key ids
        tokens = rng.integers(1, 32_000, 1024).tolist() + donors[f"d{i - 299}"][:700]
        donors[f"d{i}"] = tokens
        new.add_donor(f"d{i}", "ns", tokens)
        old.add_donor(f"d{i}", "ns", tokens)
    for i in range(1, 300, 2):
        donors.pop(f"d{i - 1}", None)
    pick = random.Random(3)
    for _ in range(40):
        a, b = pick.sample(list(donors.values()), 2)
        shift = pick.randrange(0, 100)
        target = a[shift : shift + 1500] + rng.integers(1, 32_000, 100).tolist() + b[200:900]
        assert spans_of(new, "ns", target) == old.align("ns", target)
        assert spans_of(new, "ns", target, candidates=["d1", "d3", "d4"]) == old.align(
            "ns", target, candidates=["d1", "d3", "d4"]
        )
