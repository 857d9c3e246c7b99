"""Approximate KV never passes as exact: the T1 -> T4 -> T5 chain, with a context-dependent stand-in model.

Shifted mode, isolation ``cache_salt``, engine block reuse on (prefix cache keyed by salt), 32-token blocks:

* D0 (``acme|d0``) holds text S after a 32-token preamble;
* T1 (``acme|t1``) starts with S: it receives S's 256 tokens shifted by -32, so its KV is approximate, and it
  becomes an approximate donor;
* T4 (salt ``acme``, no nonce) shares T1's first 288 tokens. An exact-looking span (same tokens, same positions)
  from an approximate donor is still approximate: T4 has no per-request salt, so it gets nothing and equals a fresh
  prefill;
* T5 repeats T4 exactly: its 320-token device prefix hit is on T4's exact KV, never on approximate KV.
"""

from __future__ import annotations

import torch

from tests.connector.conftest import decline_reason, prompt, records

SHIFTED = {
    "block_size": 32,
    "min_span_tokens": 32,
    "min_donor_tokens": 128,
    "exact_materialization_only": False,
    "isolation": "cache_salt",
    "max_deviation": 0.9,
}
S = prompt(1, 256)
U = prompt(2, 32)
D0 = prompt(3, 32) + S + prompt(4, 32)
T1 = S + U + prompt(5, 40)
T4 = S + U + prompt(6, 32) + prompt(7, 9)


def _max_error(h, r, tokens) -> float:
    return float((r.kv.float() - h.fresh_kv(tokens).float()).abs().amax())


def test_t1_t4_t5_chain_never_serves_approximate_kv_as_exact(make_harness) -> None:
    h = make_harness(prefix_reuse=True, num_blocks=512, **SHIFTED)
    d0 = h.run_request(D0, cache_salt="acme|d0")
    t1 = h.run_request(T1, cache_salt="acme|t1")
    assert d0.pinned and t1.promised == 256 and t1.pinned
    [t1_load] = records(h, "materialized", t1.request_id)
    assert t1_load.lineage == "approximate" and t1_load.delta == -32 and t1_load.requires_rope_correction
    assert _max_error(h, t1, T1) > 0.1  # T1's KV really is approximate for this model
    [t1_donor] = records(h, "donor_registered", t1.request_id)
    assert t1_donor.lineage == "approximate"

    t4 = h.run_request(T4, cache_salt="acme")
    assert t4.device_matched == 0 and t4.promised == 0 and t4.connector_written_blocks == []
    assert decline_reason(h, t4.request_id) == "isolation_required"
    assert _max_error(h, t4, T4) == 0.0
    [t4_donor] = records(h, "donor_registered", t4.request_id)
    assert t4_donor.lineage == "exact"

    t5 = h.run_request(T4, cache_salt="acme")
    assert t5.device_matched == 320 and t5.promised == 0
    assert torch.equal(t5.kv, h.fresh_kv(T4))
    materialized = records(h, "materialized")
    assert [m.request_id for m in materialized] == [str(t1.request_id)]


def test_an_isolated_recipient_gets_approximate_kv_audited_as_such_and_passes_it_on_only_as_approximate(
    make_harness,
) -> None:
    h = make_harness(prefix_reuse=True, num_blocks=512, **SHIFTED)
    h.run_request(D0, cache_salt="acme|d0")
    h.run_request(T1, cache_salt="acme|t1")
    t4 = h.run_request(T4, cache_salt="acme|t4")  # per-request salt: shifted-mode rules allow the load
    assert t4.promised == 288
    [load] = records(h, "materialized", t4.request_id)
    assert load.delta == 0 and load.lineage == "approximate" and load.requires_rope_correction is True
    [promise] = records(h, "promised", t4.request_id)
    assert promise.lineage == "approximate" and promise.requires_rope_correction is True
    assert _max_error(h, t4, T4) > 0.1
    [t4_donor] = records(h, "donor_registered", t4.request_id)
    assert t4_donor.lineage == "approximate"  # computed on top of approximate KV

    t5 = h.run_request(T4, cache_salt="acme")  # outside every nonce: no device hit, no approximate load
    assert t5.device_matched == 0 and t5.promised == 0
    assert decline_reason(h, t5.request_id) == "isolation_required"
    assert torch.equal(t5.kv, h.fresh_kv(T4))


def test_with_t1_run_cold_t4_equals_a_fresh_prefill(make_harness) -> None:
    h = make_harness(prefix_reuse=True, num_blocks=512, **SHIFTED)
    t1 = h.run_request(T1, cache_salt="acme|t1")  # no D0: T1 is cold, so exact
    assert t1.promised == 0 and records(h, "donor_registered", t1.request_id)[0].lineage == "exact"
    t4 = h.run_request(T4, cache_salt="acme")
    assert t4.promised == 288
    [load] = records(h, "materialized", t4.request_id)
    assert load.lineage == "exact" and load.requires_rope_correction is False
    assert torch.equal(t4.kv, h.fresh_kv(T4))


def test_a_device_hit_under_a_per_request_salt_counts_as_approximate_in_shifted_mode(make_harness) -> None:
    h = make_harness(prefix_reuse=True, num_blocks=512, **SHIFTED)
    h.run_request(D0, cache_salt="acme|d0")
    h.run_request(T1, cache_salt="acme|t1")
    turn2 = h.run_request(T1 + prompt(8, 40), cache_salt="acme|t1")  # the same conversation's next turn
    assert turn2.device_matched >= 256
    [donor] = records(h, "donor_registered", turn2.request_id)
    assert donor.lineage == "approximate"


def test_exact_mode_never_registers_an_approximate_donor(make_harness) -> None:
    h = make_harness(prefix_reuse=True, num_blocks=512, **{**SHIFTED, "exact_materialization_only": True})
    h.run_request(D0, cache_salt="acme|d0")
    t1 = h.run_request(T1, cache_salt="acme|t1")
    assert t1.promised == 0
    assert {r.lineage for r in records(h, "donor_registered")} == {"exact"}
