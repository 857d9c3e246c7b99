"""The checks that stand between candidate spans and a promise to TensorRT-LLM.

``get_num_new_matched_tokens`` is a promise with no failure channel, so everything that could make the copy
wrong is checked here first, against the donor registry's current state (never against what a hint says):
donor still pinned, namespace equal, tokens equal (compared token by token with the registry's copy: here, unless the
caller's own lookup just compared exactly these donor arrays), target side contiguous from the
device-matched prefix and cut to whole blocks, at least one prompt token left to compute, exact mode only with
the same tokens at the same positions after the same context from a donor whose own KV is exact (lineage), and RoPE
support for shifted spans.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.policy import Lineage
from semblend_dynamo.span_aligner import Span

from . import native_validation
from .donors import Donor, DonorRegistry


# Segment and ValidatedLoad are frozen, but their __init__ writes the instance dict directly: a frozen dataclass's own
# __init__ goes through object.__setattr__ per field, ~10x a plain class's (3.4 and 8.3 against ~0.5 µs on the VM), and
# one of each is made on every promise. Assignment still raises FrozenInstanceError (tests/connector/test_validated_load).
@dataclass(frozen=True, init=False)
class Segment:
    """Tokens ``target[target_start : target_start + length]`` come from ``donor`` at ``donor_start``."""

    donor: Donor
    generation: int
    donor_start: int
    target_start: int
    length: int
    exact_equivalent: bool
    """Same tokens at the same positions after the same context, from an exact donor: the KV equals a fresh prefill."""

    def __init__(
        self, donor: Donor, generation: int, donor_start: int, target_start: int, length: int, exact_equivalent: bool
    ) -> None:
        values = self.__dict__
        values["donor"] = donor
        values["generation"] = generation
        values["donor_start"] = donor_start
        values["target_start"] = target_start
        values["length"] = length
        values["exact_equivalent"] = exact_equivalent

    @property
    def delta(self) -> int:
        return self.target_start - self.donor_start


@dataclass(frozen=True, init=False)
class ValidatedLoad:
    """A load that passed every check: ``tokens`` (whole blocks) starting at ``start``."""

    start: int
    tokens: int
    segments: tuple[Segment, ...]
    # Derived once at construction (read several times per decision; Python 3.11's cached_property takes a lock).
    requires_rope_correction: bool = field(init=False)
    lineage: Lineage = field(init=False)
    """Approximate when some KV moves, follows another context or comes from an approximate donor."""

    def __init__(self, start: int, tokens: int, segments: tuple[Segment, ...]) -> None:
        rotates = approximate = False
        for s in segments:
            if s.target_start != s.donor_start:
                rotates = True
            if not s.exact_equivalent:
                approximate = True
        values = self.__dict__
        values["start"] = start
        values["tokens"] = tokens
        values["segments"] = segments
        values["requires_rope_correction"] = rotates
        values["lineage"] = Lineage.APPROXIMATE if approximate else Lineage.EXACT


_TARGET_START = operator.attrgetter("target_start")


class Declined(Exception):
    """A check failed; ``reason`` is audited and the request runs without donor KV."""

    def __init__(self, reason: DeclineReason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)
        self.reason = reason
        self.detail = detail


def validate_load(
    target: np.ndarray,
    num_computed: int,
    spans: Sequence[Span],
    registry: DonorRegistry,
    *,
    namespace_digest: str,
    tokens_per_block: int,
    exact_only: bool,
    shift_supported: bool,
    tokens_checked: bool = False,
) -> ValidatedLoad:
    """The load these spans allow beyond ``num_computed`` device-matched tokens; raises :class:`Declined`.

    ``target`` is the prompt as a uint32 array, compared with the donors' uint32 arrays.
    ``tokens_checked``: every span came from a token-by-token comparison of ``target`` with the registry's own array
    of its donor, in this same call (the exact-prefix lookup, a hint's re-check), so its tokens are not compared a
    second time; spans from the span aligner always are.
    """
    if NATIVE_LOAD is not None:  # the compiled passing path; None: this code decides
        passed: ValidatedLoad | None = NATIVE_LOAD(
            target,
            num_computed,
            spans,
            registry,
            namespace_digest,
            tokens_per_block,
            exact_only,
            shift_supported,
            tokens_checked,
        )
        if passed is not None:
            return passed
    tpb = tokens_per_block
    if num_computed % tpb:
        raise Declined(DeclineReason.ALIGNMENT_NOT_BLOCK_ALIGNED, f"device prefix {num_computed} tokens")
    limit = (len(target) - 1) // tpb * tpb  # at least one prompt token must stay uncomputed
    if limit <= num_computed:
        raise Declined(DeclineReason.PROMPT_TOO_SHORT, f"{len(target)} tokens, {num_computed} already on device")

    pieces: list[tuple[Span, int, int]] = []  # span, first target position used, end
    pos = num_computed
    for span in sorted(spans, key=_TARGET_START):
        if span.target_end <= pos:
            continue
        if span.target_start > pos or pos >= limit:
            break
        end = min(span.target_end, limit)
        pieces.append((span, pos, end))
        pos = end
    end = pos // tpb * tpb
    if end <= num_computed:
        raise Declined(DeclineReason.NOT_PREFIX_CONTIGUOUS, f"no span continues the prefix at token {num_computed}")

    segments: list[Segment] = []
    for span, start, stop in pieces:
        stop = min(stop, end)
        if stop <= start:
            break
        donor = registry.get(span.donor_id)
        if donor is None:
            raise Declined(registry.why_gone(span.donor_id), span.donor_id)
        if donor.namespace_digest != namespace_digest:
            raise Declined(DeclineReason.NAMESPACE_MISMATCH, span.donor_id)
        d0 = span.donor_start + (start - span.target_start)
        n = stop - start
        if d0 + n > len(donor.tokens) or -(-(d0 + n) // tpb) > len(donor.block_ids):
            raise Declined(DeclineReason.DONOR_NOT_RESIDENT, f"{span.donor_id} has no KV for tokens {d0}..{d0 + n}")
        tokens = donor.tokens
        if not tokens_checked and not _same(target[start:stop], tokens[d0 : d0 + n]):
            raise Declined(DeclineReason.NO_CANDIDATE, f"{span.donor_id}: span tokens differ")
        # The same context before: nothing to compare from position 0 (an exact hit's usual start).
        exact = donor.lineage is Lineage.EXACT and d0 == start and (not start or _same(target[:start], tokens[:d0]))
        if exact_only and not exact:
            why = (
                "an approximate donor"
                if donor.lineage is Lineage.APPROXIMATE
                else f"delta {start - d0} or other context"
            )
            raise Declined(DeclineReason.EXACT_ONLY_MODE, f"{span.donor_id}: {why}")
        segment = Segment(donor, donor.generation, d0, start, n, exact)
        segments.append(segment)
    load = ValidatedLoad(num_computed, end - num_computed, tuple(segments))
    if load.requires_rope_correction and not shift_supported:
        raise Declined(DeclineReason.UNSUPPORTED_ROPE)
    return load


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Token-equal: two uint32 arrays (the prompt, a donor's), their bytes compared.

    Two copies and a ``memcmp``: in the scheduler's flow (caches cold from reading the prompt) about a quarter of what
    ``(a != b).any()`` takes (its ufunc and reduction: ~12 of ~16 µs for 6K tokens on the development VM).
    """
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def trim_load(load: ValidatedLoad, start: int, end: int) -> ValidatedLoad:
    """The part of ``load`` for target tokens ``[start, end)`` (``cancel_load``: the runtime consumes only that)."""
    if not load.start <= start < end <= load.start + load.tokens:
        raise ValueError(f"[{start}, {end}) is not inside the load [{load.start}, {load.start + load.tokens})")
    segments = []
    for seg in load.segments:
        lo, hi = max(start, seg.target_start), min(end, seg.target_start + seg.length)
        if lo < hi:
            shift = lo - seg.target_start
            segments.append(
                Segment(seg.donor, seg.generation, seg.donor_start + shift, lo, hi - lo, seg.exact_equivalent)
            )
    return ValidatedLoad(start, end - start, tuple(segments))


NATIVE_LOAD, NATIVE_REASON = native_validation.use((Segment, ValidatedLoad, Lineage.EXACT))
"""validate_load's compiled passing path (:mod:`trtllm_connector.native_validation`) and why it is (not) used."""
if NATIVE_LOAD is None:
    logging.getLogger(__name__).log(
        logging.INFO if native_validation.disabled() else logging.WARNING,
        "load validation: Python only (%s)",
        NATIVE_REASON,
    )
