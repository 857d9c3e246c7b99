"""DonorRegistry on its own: budget, LRU, TTL, leases, generations and release hand-off."""

from __future__ import annotations

import numpy as np
import pytest

from semblend_dynamo.events.schemas import request_key, u32_tokens
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.outcomes import DeclineReason
from trtllm_connector.donors import DonorRegistry

from .conftest import ManualClock

NS = NamespaceKey(model_id="m", tokens_per_block=8)


def _registry(budget: int = 10, ttl: float = 60.0) -> tuple[DonorRegistry, ManualClock]:
    clock = ManualClock()
    return DonorRegistry(budget, ttl, worker_id=0xAB, clock=clock), clock


def test_admit_pins_and_indexes_blocks() -> None:
    reg, _ = _registry()
    result = reg.admit(1, NS, list(range(24)), [5, 6, 7])
    assert result.donor is not None and result.donor.donor_id == "ab:1"
    assert reg.pinned_blocks == 3 and reg.get("ab:1") is result.donor
    assert reg.get("ab:1").generation == 1 and reg.admit(2, NS, [1], [8]).donor.generation == 2


def test_budget_holds_and_lru_makes_room_for_the_next_donor() -> None:
    reg, _ = _registry(budget=10)
    a = reg.admit(1, NS, [1], [0, 1, 2, 3]).donor
    b = reg.admit(2, NS, [1], [4, 5, 6, 7]).donor
    assert a is not None and b is not None
    assert reg.get(a.donor_id) is None  # released right away: room for another 4-block donor
    assert reg.why_gone(a.donor_id) == DeclineReason.DONOR_EVICTED
    assert reg.held_blocks == 8  # a's blocks still count until the workers report it
    refused = reg.admit(3, NS, [1], [8, 9, 10, 11])
    assert refused.donor is None and refused.reason == DeclineReason.CAPACITY
    assert reg.take_releases() == [1] and reg.held_blocks == 8
    assert reg.take_releases() == [] and reg.held_blocks == 4
    assert reg.admit(4, NS, [1], [12, 13, 14, 15]).donor is not None
    assert reg.held_blocks <= 10


def test_leased_donors_survive_ttl_and_eviction() -> None:
    reg, clock = _registry(ttl=10.0)
    d = reg.admit(1, NS, [1], [0]).donor
    reg.lease(d)
    clock.advance(11.0)
    assert reg.tick() == [] and reg.evict(d.donor_id) is None
    reg.unlease(d.donor_id)
    assert [x.donor_id for x in reg.tick()] == [d.donor_id]
    assert reg.why_gone(d.donor_id) == DeclineReason.DONOR_LEASE_EXPIRED


def test_touch_refreshes_the_ttl() -> None:
    reg, clock = _registry(ttl=10.0)
    d = reg.admit(1, NS, [1], [0]).donor
    clock.advance(8.0)
    reg.touch(d)
    clock.advance(8.0)
    assert reg.tick() == []


def test_reallocated_block_invalidates_its_donor() -> None:
    reg, _ = _registry()
    d = reg.admit(1, NS, [1], [3, 4]).donor
    other = reg.admit(2, NS, [1], [5]).donor
    gen = d.generation
    assert [x.donor_id for x in reg.note_allocation([9, 4])] == [d.donor_id]
    assert d.generation != gen and reg.get(d.donor_id) is None
    assert reg.why_gone(d.donor_id) == DeclineReason.GENERATION_MISMATCH
    assert reg.get(other.donor_id) is other
    assert reg.why_gone("ab:999") == DeclineReason.DONOR_NOT_RESIDENT


def test_admit_keeps_the_tokens_as_a_read_only_uint32_array_and_the_prompts_request_key() -> None:
    reg, _ = _registry()
    tokens = [7, 2**32 - 1, 0, 31999] * 4
    donor = reg.admit(1, NS, tokens, [0, 1]).donor
    assert donor is not None and donor.tokens.dtype == np.uint32 and donor.tokens.tolist() == tokens
    assert not donor.tokens.flags.writeable
    assert donor.key == request_key(tokens) and reg.by_key(request_key(tokens)) is donor


def test_admit_keeps_a_read_only_uint32_copy_of_a_u32_prompt_array() -> None:
    reg, _ = _registry()
    tokens = [7, 2**32 - 1, 0, 31999] * 4
    prompt = u32_tokens(tokens)  # what the connector hands over: the array it decided on
    donor = reg.admit(1, NS, prompt, [0, 1]).donor
    assert donor is not None and donor.tokens.dtype == np.uint32 and donor.tokens.tolist() == tokens
    assert not donor.tokens.flags.writeable and donor.tokens.base is None  # owns its memory: the aligner shares it
    prompt[0] = 8  # the caller's array stays the caller's
    assert donor.tokens[0] == 7


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5])
def test_admit_refuses_token_ids_outside_u32_and_pins_nothing(bad: object) -> None:
    reg, _ = _registry()
    with pytest.raises(ValueError, match=r"token ids must be integers in \[0, 2\*\*32\)"):
        reg.admit(1, NS, [1, 2, bad, 3], [0])
    assert len(reg) == 0 and reg.pinned_blocks == 0


@pytest.mark.parametrize("dtype", [np.uint32, np.int64])
def test_longest_prefix_finds_the_same_donor_for_uint32_and_int64_targets(dtype: type) -> None:
    reg = DonorRegistry(100, 60.0, tokens_per_block=8, worker_id=0xAB)
    shared = list(range(100, 124))
    reg.admit(1, NS, [*shared, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3])
    reg.admit(2, NS, [*shared[:8], 9] + [0] * 23, [4, 5, 6, 7])
    target = np.array([*shared, 42, 43], dtype=dtype)
    assert reg.longest_prefix(NS.digest(), target) == ("ab:1", 24)
    assert reg.longest_prefix(NS.digest(), np.array([5] * 16, dtype=dtype)) == ("", 0)
    assert reg.longest_prefix("other", target) == ("", 0)


def test_longest_prefix_compares_ids_too_wide_for_the_first_block_key() -> None:
    reg = DonorRegistry(100, 60.0, tokens_per_block=8, worker_id=0xAB)
    reg.admit(1, NS, list(range(16)), [0, 1])
    wrapped = np.array([2**32, *range(1, 16)], dtype=np.int64)  # same uint32 key as the donor's first block
    assert reg.longest_prefix(NS.digest(), wrapped) == ("", 0)
