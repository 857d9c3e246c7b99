"""validate_load's token re-check: spans are compared with the registry's copy unless the caller just did that."""

from __future__ import annotations

import numpy as np
import pytest

from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.span_aligner import Span
from trtllm_connector.donors import DonorRegistry
from trtllm_connector.validation import Declined, validate_load

NS = NamespaceKey(model_id="m", tokens_per_block=8)


def _load(target: np.ndarray, reg: DonorRegistry, span: Span, *, tokens_checked: bool = False) -> int:
    load = validate_load(
        target,
        0,
        [span],
        reg,
        namespace_digest=NS.digest(),
        tokens_per_block=8,
        exact_only=True,
        shift_supported=True,
        tokens_checked=tokens_checked,
    )
    return load.tokens


def test_span_tokens_are_compared_with_the_registry_copy() -> None:
    reg = DonorRegistry(100, 60.0, tokens_per_block=8)
    donor = reg.admit(1, NS, list(range(1, 33)), [0, 1, 2, 3]).donor
    assert donor is not None
    target = np.arange(1, 41, dtype=np.uint32)
    assert _load(target, reg, Span(donor.donor_id, 0, 0, 32)) == 32
    target[20] = 999  # the span claims tokens the donor does not hold
    with pytest.raises(Declined) as declined:
        _load(target, reg, Span(donor.donor_id, 0, 0, 32))
    assert declined.value.reason == DeclineReason.NO_CANDIDATE
    # The connector passes tokens_checked only for spans its own lookup just compared with these arrays.
    assert _load(target, reg, Span(donor.donor_id, 0, 0, 16), tokens_checked=True) == 16


def test_a_device_prefix_must_be_the_donors_own_context() -> None:
    reg = DonorRegistry(100, 60.0, tokens_per_block=8)
    donor = reg.admit(1, NS, list(range(1, 33)), [0, 1, 2, 3]).donor
    assert donor is not None

    def load_after(target: np.ndarray, computed: int) -> int:
        return validate_load(
            target,
            computed,
            [Span(donor.donor_id, 0, 0, 32)],
            reg,
            namespace_digest=NS.digest(),
            tokens_per_block=8,
            exact_only=True,
            shift_supported=True,
        ).tokens

    target = np.arange(1, 41, dtype=np.uint32)
    assert load_after(target, 0) == 32 and load_after(target, 8) == 24
    target[3] = 999  # inside the device prefix: the tokens after it no longer follow the donor's context
    with pytest.raises(Declined) as declined:
        load_after(target, 8)
    assert declined.value.reason == DeclineReason.EXACT_ONLY_MODE


def test_a_prompt_of_another_width_is_never_taken_for_the_donors_tokens() -> None:
    """Tokens are compared as uint32 bytes: an int64 prompt with the same values fails closed (no_candidate)."""
    reg = DonorRegistry(100, 60.0, tokens_per_block=8)
    donor = reg.admit(1, NS, list(range(1, 33)), [0, 1, 2, 3]).donor
    assert donor is not None
    with pytest.raises(Declined) as declined:
        _load(np.arange(1, 41, dtype=np.int64), reg, Span(donor.donor_id, 0, 0, 32))
    assert declined.value.reason == DeclineReason.NO_CANDIDATE
