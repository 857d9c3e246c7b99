"""Donor lifecycle: hints against evicted / re-allocated / expired donors, the pin budget, the release rule."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from semblend_dynamo.events.schemas import DonorHint, request_key
from trtllm_connector.donors import Donor
from trtllm_connector.harness import HarnessRequest, PyExecutorHarness

from .conftest import BLOCK, decline_reason, prompt, records


def _hint(h: PyExecutorHarness, target: list[int], donor_id: str) -> DonorHint:
    return DonorHint(
        request_key=request_key(target),
        donor_id=donor_id,
        worker_id=h.scheduler.cfg.worker_id,
        namespace=h.scheduler.model.namespace().digest(),
        spans=[(0, 0, 64)],
        decision="semantic_placement",
    )


def _donor_and_target(h: PyExecutorHarness) -> tuple[str, list[int]]:
    donor = prompt(31, 100)
    r = h.run_request(donor)
    assert r.pinned
    return h.scheduler.registry.donor_id_for(r.request_id), donor[:72] + prompt(32, 30)


def test_hint_for_a_pinned_donor_materializes(make_harness) -> None:
    h = make_harness()
    donor_id, target = _donor_and_target(h)
    h.scheduler.hints.submit(_hint(h, target, donor_id))
    r = h.run_request(target)
    assert r.promised == 72
    assert records(h, "materialized", r.request_id)[0].donor_id == donor_id


def test_donor_evicted_between_hint_and_promise(make_harness) -> None:
    h = make_harness()
    donor_id, target = _donor_and_target(h)
    h.scheduler.hints.submit(_hint(h, target, donor_id))
    assert h.scheduler.evict_donor(donor_id)
    assert donor_id not in h.scheduler.aligner
    r = h.run_request(target)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "donor_evicted"


def test_donor_reallocated_between_hint_and_promise(make_harness) -> None:
    h = make_harness()
    donor_id, target = _donor_and_target(h)
    h.scheduler.hints.submit(_hint(h, target, donor_id))
    h.reallocate(h.scheduler.registry.get(donor_id).block_ids[:1])
    r = h.run_request(target)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "generation_mismatch"


def test_donor_lease_expired_between_hint_and_promise(make_harness, clock) -> None:
    h = make_harness(pin_ttl_s=30.0)
    donor_id, target = _donor_and_target(h)
    h.scheduler.hints.submit(_hint(h, target, donor_id))
    clock.advance(31.0)
    released = h.idle_iteration()
    assert released == [int(donor_id.split(":")[1])]  # the worker reported it; the engine freed its blocks
    r = h.run_request(target)
    assert r.promised == 0 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "donor_lease_expired"


def test_unknown_donor_hint_is_declined(make_harness) -> None:
    h = make_harness()
    _, target = _donor_and_target(h)
    h.scheduler.hints.submit(_hint(h, target, "0:999"))
    r = h.run_request(target)
    assert r.promised == 0 and decline_reason(h, r.request_id) == "donor_not_resident"


def test_hint_from_another_namespace_is_declined(make_harness) -> None:
    h = make_harness()
    donor_id, target = _donor_and_target(h)
    hint = _hint(h, target, donor_id).model_copy(update={"namespace": "0123456789abcdef"})
    h.scheduler.hints.submit(hint)
    r = h.run_request(target)
    assert r.promised == 0 and decline_reason(h, r.request_id) == "namespace_mismatch"


def test_reallocation_after_promise_is_caught_in_build_connector_meta(make_harness) -> None:
    """The promise cannot be retracted; the copy is dropped (never reading a re-used block) and audited."""
    h = make_harness()
    donor_id, target = _donor_and_target(h)
    sched = h.scheduler
    real_update = sched.update_state_after_alloc

    def update_then_steal(request, block_ids):  # the engine re-uses a donor block right after the promise
        real_update(request, block_ids)
        donor = sched.registry.get(donor_id)
        if donor is not None:
            real_update(type(request)(10_000, [0] * 8), [donor.block_ids[0]])

    sched.update_state_after_alloc = update_then_steal
    r = h.run_request(target)
    assert r.promised == 72 and r.connector_written_blocks == []
    assert decline_reason(h, r.request_id) == "generation_mismatch"
    assert records(h, "materialized") == []
    assert r.pinned is False  # promised KV that was never loaded: never a donor


def test_pin_budget_holds_under_a_stream_of_1k_requests(make_harness, clock) -> None:
    h = make_harness(
        num_blocks=512,
        pin_budget_fraction=0.25,
        pin_ttl_s=5.0,
        min_donor_tokens=16,
        geometry={"num_layers": 1, "num_kv_heads": 1, "head_dim": 8},
    )
    budget = int(512 * 0.25)
    rng = random.Random(5)
    bases = [prompt(1000 + i, 96) for i in range(12)]
    promised = 0
    for _ in range(1000):
        clock.advance(rng.random())
        base = rng.choice(bases)
        cut = rng.randrange(16, 96)
        r = h.run_request(base[:cut] + prompt(rng.randrange(10**6), rng.randrange(1, 40)), capture_kv=False)
        promised += r.promised
        assert h.pinned_blocks <= budget
        assert h.scheduler.registry.held_blocks <= budget
    assert h.max_pinned_blocks <= budget
    assert h.max_pinned_blocks > budget // 2  # the budget was actually exercised
    assert promised > 0
    assert h.allocator.num_free + h.pinned_blocks == 512  # nothing leaked


def test_worker_reports_a_release_only_after_the_id_was_passed_in(make_harness) -> None:
    h = make_harness()
    worker = h.worker
    worker._releases_due.add(77)
    assert worker.get_finished([], []) == ([], [])
    assert worker.get_finished([77], []) == ([77], [])
    assert worker.get_finished([], []) == ([], [])


@pytest.mark.parametrize("fraction", [0.0, 0.01])
def test_donor_larger_than_the_budget_is_not_pinned(make_harness, fraction) -> None:
    h = make_harness(pin_budget_fraction=fraction)
    assert h.run_request(prompt(40, 100)).pinned is False
    assert h.pinned_blocks == 0


def test_leases_are_returned_after_a_multi_segment_load(make_harness) -> None:
    h = make_harness(exact_materialization_only=False, isolation="no_block_reuse", max_deviation=0.9)
    first, second = prompt(70, 32), prompt(71, 48)
    h.run_request(prompt(72, 8) + first + prompt(73, 24) + second)  # both spans in one donor, separated
    r = h.run_request(first + second + prompt(74, 9))
    assert r.promised == 80
    assert len(records(h, "materialized", r.request_id)) == 1
    assert all(d.leases == 0 for d in h.scheduler.registry.donors())


def test_a_promise_without_allocation_is_dropped_and_its_leases_returned(make_harness) -> None:
    h = make_harness()
    donor_id, target = _donor_and_target(h)
    request = HarnessRequest(500, target)
    assert h.scheduler.get_num_new_matched_tokens(request, 0) == (72, False)
    assert h.scheduler.registry.get(donor_id).leases == 1
    h.idle_iteration()  # build_connector_meta without update_state_after_alloc for that request
    assert h.scheduler.registry.get(donor_id).leases == 0
    assert decline_reason(h, 500) == "internal_error"


def test_a_donor_holds_its_prompt_tokens_only_not_the_generated_ones(make_harness) -> None:
    h = make_harness()
    tokens = prompt(80, 100)
    r = h.run_request(tokens, output_tokens=5)
    donor = h.scheduler.registry.get(h.scheduler.registry.donor_id_for(r.request_id))
    assert r.pinned and donor is not None and donor.tokens.tolist() == tokens


def test_the_span_aligner_indexes_the_registrys_uint32_tokens_without_a_copy(make_harness) -> None:
    h = make_harness()
    r = h.run_request(prompt(84, 100))
    donor = h.scheduler.registry.get(h.scheduler.registry.donor_id_for(r.request_id))
    assert donor is not None and donor.tokens.dtype == np.uint32
    assert np.shares_memory(h.scheduler.aligner.donor_tokens(donor.donor_id), donor.tokens)


class TokensCountingRequest(HarnessRequest):
    """A harness request that counts ``get_tokens`` calls and can change its tokens (TensorRT-LLM's never do)."""

    def __init__(self, request_id: int, tokens: list[int]) -> None:
        super().__init__(request_id, tokens, cache_salt=None)
        self.reads = 0

    def get_tokens(self, beam: int) -> list[int]:
        self.reads += 1
        return super().get_tokens(beam)


def _finish(h: Any, request: HarnessRequest, first_block: int) -> Donor | None:
    sched = h.scheduler
    blocks = list(range(first_block, first_block + -(-request.prompt_len // BLOCK)))
    sched.update_state_after_alloc(request, blocks)
    sched.build_connector_meta(h._scheduler_output(new_requests=[], cached_requests=[]))
    assert sched.request_finished(request, blocks)
    return sched.registry.get(sched.registry.donor_id_for(request.request_id))


def test_a_decided_request_becomes_a_donor_of_the_prompt_it_was_decided_on_without_a_second_read(
    make_harness,
) -> None:
    h = make_harness()
    tokens = prompt(81, 64)
    request = TokensCountingRequest(9001, tokens)
    assert h.scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    request._tokens[0] += 1  # not something TensorRT-LLM does: shows which tokens the donor holds
    donor = _finish(h, request, 100)
    assert request.reads == 1 and donor is not None and donor.tokens.tolist() == tokens
    assert donor.key == request_key(tokens)


def test_a_request_never_decided_on_or_whose_prompt_len_changed_is_read_at_finish(make_harness) -> None:
    h = make_harness()
    undecided = TokensCountingRequest(9002, prompt(82, 64))
    donor = _finish(h, undecided, 100)
    assert undecided.reads == 1 and donor is not None and donor.tokens.tolist() == prompt(82, 64)
    changed = TokensCountingRequest(9003, prompt(83, 64))
    h.scheduler.get_num_new_matched_tokens(changed, 0)
    changed.prompt_len = 48
    donor = _finish(h, changed, 200)
    assert changed.reads == 2 and donor is not None and donor.tokens.tolist() == prompt(83, 48)


def test_request_reset_forgets_the_decided_prompt(make_harness) -> None:
    h = make_harness()
    request = TokensCountingRequest(9004, prompt(84, 64))
    h.scheduler.get_num_new_matched_tokens(request, 0)
    h.scheduler.request_reset(request)
    assert _finish(h, request, 100) is not None and request.reads == 2


def test_a_prompt_read_as_a_list_a_fresh_list_or_a_buffer_gives_the_same_decisions(make_harness) -> None:
    """``get_tokens`` as the harness copies it, as TensorRT-LLM's binding converts it, and as a zero-copy int32 view:
    the same donors, promises, loads and audit trail."""

    def trail(tokens_from: str) -> list[tuple[Any, ...]]:
        h = make_harness()
        donor = prompt(31, 100)
        first = h.run_request(donor, tokens_from=tokens_from)
        assert first.pinned
        pinned = h.scheduler.registry.get(h.scheduler.registry.donor_id_for(first.request_id))
        assert pinned is not None and pinned.tokens.tolist() == donor
        hit = h.run_request(donor[:72] + prompt(32, 30), tokens_from=tokens_from)
        miss = h.run_request(prompt(33, 90), tokens_from=tokens_from)
        assert hit.promised > 0 and miss.promised == 0
        fields = ("event", "request_id", "donor_id", "tokens", "delta", "lineage", "rejection_reason", "found")
        audit = [tuple(getattr(r, f) for f in fields) for r in records(h)]
        return [(r.promised, r.connector_written_blocks) for r in (first, hit, miss)] + audit

    assert trail("list") == trail("vector") == trail("view")


def test_harness_tokens_as_a_vector_come_back_as_a_fresh_list_each_read() -> None:
    """``tokens_from="vector"`` holds the prompt as TensorRT-LLM does (a C++ int32 vector) and makes every read a new
    list of new ints, as its binding's ``get_tokens`` does; ``"list"`` copies a Python list."""
    prompt = [5, 300_000, 70_000, 1 << 30]
    for kind in ("list", "vector"):
        request = HarnessRequest(1, prompt, tokens_from=kind)
        first, second = request.get_tokens(0), request.get_tokens(0)
        assert first == second == prompt and first is not second
        request.append(9)
        assert request.get_tokens(0) == [*prompt, 9]
    view = HarnessRequest(5, prompt, tokens_from="view").get_tokens(0)
    assert isinstance(view, np.ndarray) and view.dtype == np.int32 and not view.flags.writeable
    assert view.tolist() == prompt
    vector = HarnessRequest(2, prompt, tokens_from="vector")
    assert vector.get_tokens(0)[1] is not vector.get_tokens(0)[1]  # new int objects, not the held ones
    with pytest.raises(ValueError, match="tokens_from"):
        HarnessRequest(3, prompt, tokens_from="tuple")  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        HarnessRequest(4, [1 << 31], tokens_from="vector")  # token ids are int32 in TensorRT-LLM
