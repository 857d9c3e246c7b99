"""Donor registrations and kv-events of one worker, for the catalog and indexer tests."""

from __future__ import annotations

import numpy as np

from semblend_dynamo.events.schemas import DonorRegistration, KvEvent, KvStored

W1 = 11


def registration(donor_id: str, hashes: list[int], dim: int, registered_at: float = 1.0) -> DonorRegistration:
    """A peer-style registration on ``W1`` of 16-token blocks with a unit embedding seeded from the donor."""
    vector = np.random.default_rng(len(donor_id) + hashes[0]).standard_normal(dim).astype(np.float32)
    embedding, edim = DonorRegistration.pack_embedding(vector / np.linalg.norm(vector))
    return DonorRegistration(
        donor_id=donor_id,
        worker_id=W1,
        deployment="d",
        namespace="ns",
        num_tokens=16 * len(hashes),
        block_size=16,
        block_hashes=hashes,
        embedding=embedding,
        embedding_dim=edim,
        registered_at=registered_at,
    )


def stored(event_id: int, *hashes: int) -> KvEvent:
    """``W1`` stored blocks of these content hashes."""
    return KvEvent(W1, event_id, KvStored([1000 + h for h in hashes], list(hashes)))
