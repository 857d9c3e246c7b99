"""``Segment`` and ``ValidatedLoad``: immutable values whose derived fields say whether the load rotates and its
lineage (they are made on every promise, so their construction is kept cheap; these are its contract)."""

from __future__ import annotations

import dataclasses

import pytest

from semblend_dynamo.policy import Lineage
from trtllm_connector.validation import Segment, ValidatedLoad


def segment(donor_start: int, target_start: int, exact: bool, length: int = 64) -> Segment:
    return Segment(None, 3, donor_start, target_start, length, exact)  # type: ignore[arg-type]


def test_a_segment_holds_its_fields_and_its_delta_and_cannot_change() -> None:
    s = segment(40, 0, False)
    assert (s.donor, s.generation, s.donor_start, s.target_start, s.length, s.exact_equivalent) == (
        None,
        3,
        40,
        0,
        64,
        False,
    )
    assert s.delta == -40
    assert s == segment(40, 0, False) and s != segment(40, 0, True)
    assert [f.name for f in dataclasses.fields(s)] == [
        "donor",
        "generation",
        "donor_start",
        "target_start",
        "length",
        "exact_equivalent",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.length = 32  # type: ignore[misc]
    assert dataclasses.replace(s, length=32).length == 32


@pytest.mark.parametrize(
    ("segments", "rotates", "lineage"),
    [
        ((segment(0, 0, True),), False, Lineage.EXACT),
        ((segment(0, 0, True), segment(64, 64, True)), False, Lineage.EXACT),
        ((segment(40, 0, False),), True, Lineage.APPROXIMATE),
        ((segment(64, 64, False),), False, Lineage.APPROXIMATE),  # same positions, other context
        ((segment(0, 0, True), segment(100, 64, False)), True, Lineage.APPROXIMATE),
    ],
)
def test_a_load_derives_its_rotation_and_lineage_from_its_segments(
    segments: tuple[Segment, ...], rotates: bool, lineage: Lineage
) -> None:
    load = ValidatedLoad(0, 64 * len(segments), segments)
    assert (load.start, load.tokens, load.segments) == (0, 64 * len(segments), segments)
    assert load.requires_rope_correction is rotates and load.lineage is lineage
    assert load == ValidatedLoad(0, 64 * len(segments), segments)
    with pytest.raises(dataclasses.FrozenInstanceError):
        load.tokens = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        load.lineage = Lineage.EXACT  # type: ignore[misc]
    trimmed = dataclasses.replace(load, tokens=32)
    assert trimmed.tokens == 32 and trimmed.lineage is lineage
