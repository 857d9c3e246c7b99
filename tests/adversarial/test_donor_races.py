"""A donor evicted, re-allocated or expired between the router's evidence and the connector's promise.

Each case: the router's hint names a pinned donor; the donor goes away; the request arrives. It must be declined with
the real reason (audited), get 0 tokens, and its KV must equal a fresh prefill in every position (0 wrong tokens).
"""

from __future__ import annotations

import pytest

from semblend_dynamo.events.schemas import DonorHint, request_key
from tests.connector.conftest import prompt, records
from trtllm_connector.harness import PyExecutorHarness

MODES = {
    "exact": {},
    "shifted": {"exact_materialization_only": False, "isolation": "cache_salt", "max_deviation": 0.9},
}
PRE, SHARED = prompt(61, 24), prompt(62, 64)


def _setup(h: PyExecutorHarness, mode: str) -> tuple[str, list[int], str | None]:
    donor = PRE + SHARED + prompt(63, 12) if mode == "shifted" else SHARED + prompt(63, 36)
    salt = "acme|d" if mode == "shifted" else None
    r = h.run_request(donor, cache_salt=salt)
    assert r.pinned
    donor_id = h.scheduler.registry.donor_id_for(r.request_id)
    target = SHARED + prompt(64, 20)
    offset = len(PRE) if mode == "shifted" else 0
    tenant = "acme" if mode == "shifted" else ""
    h.scheduler.hints.submit(
        DonorHint(
            request_key=request_key(target),
            donor_id=donor_id,
            worker_id=h.scheduler.cfg.worker_id,
            namespace=h.scheduler.model.namespace(tenant=tenant).digest(),
            spans=[(offset, 0, 64)],
            similarity=0.99,
            decision="semantic_placement",
        )
    )
    return donor_id, target, "acme|t" if mode == "shifted" else None


def _evict(h: PyExecutorHarness, donor_id: str, clock) -> None:
    assert h.scheduler.evict_donor(donor_id)


def _reallocate(h: PyExecutorHarness, donor_id: str, clock) -> None:
    h.reallocate(h.scheduler.registry.get(donor_id).block_ids[:1])


def _expire(h: PyExecutorHarness, donor_id: str, clock) -> None:
    clock.advance(h.scheduler.cfg.pin_ttl_s + 1)
    assert h.idle_iteration() == [int(donor_id.split(":")[1])]


RACES = {"donor_evicted": _evict, "generation_mismatch": _reallocate, "donor_lease_expired": _expire}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("reason", sorted(RACES))
def test_donor_gone_between_evidence_and_promise(make_harness, clock, mode: str, reason: str) -> None:
    h = make_harness(**MODES[mode])
    donor_id, target, salt = _setup(h, mode)
    RACES[reason](h, donor_id, clock)
    r = h.run_request(target, cache_salt=salt)
    wrong_tokens = int((r.kv != h.fresh_kv(target)).flatten(1).any(dim=1).sum())
    assert (r.promised, len(r.connector_written_blocks), wrong_tokens) == (0, 0, 0)
    [declined] = records(h, "declined", r.request_id)
    assert declined.rejection_reason == reason and declined.outcome == "backend_declined"
    assert records(h, "materialized") == []
