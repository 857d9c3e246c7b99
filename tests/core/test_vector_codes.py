"""A donor embedding's stored forms: the int8 codes a catalog keeps for an i8 index give that index exactly what the
float vector gives it, and conversions between the forms keep every vector's direction."""

from __future__ import annotations

import numpy as np
import pytest

from semblend_dynamo.config import IndexBackend
from semblend_dynamo.donor_index import DonorIndex, usearch_available
from semblend_dynamo.events.schemas import DonorRegistration
from semblend_dynamo.router.residency import Residency
from semblend_dynamo.vector_codes import codes_unit, i8_codes, quantize_i8, stored_forms, to_f16

DIM = 384


def _registrations(count: int, seed: int) -> list[DonorRegistration]:
    """Peer registrations with float16 embeddings of assorted lengths (not only unit vectors)."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32) * rng.uniform(0.01, 50.0, (count, 1))
    return [
        DonorRegistration(
            donor_id=f"d{i}",
            worker_id=1,
            deployment="d",
            namespace="ns",
            num_tokens=16,
            block_size=16,
            block_hashes=[i + 1],
            embedding=DonorRegistration.pack_embedding(vectors[i])[0],
            embedding_dim=DIM,
        )
        for i in range(count)
    ]


@pytest.mark.skipif(not usearch_available(), reason="usearch not installed")
def test_an_entrys_codes_give_the_i8_index_what_the_float_vector_gives_it() -> None:
    """Recall is unchanged: inserting an entry's vector (its kept codes) stores the same codes and reads back the same
    vector as inserting the registration's float vector (in a batch or one at a time), and an index built from the
    codes searches as one built the same way from the floats (one at a time: a batch builds its graph on several
    threads, in no fixed order)."""
    registrations = _registrations(300, seed=1)
    residency = Residency(capacity=1000, codes=True)
    residency.add_many(registrations)
    entries = residency.entries([r.donor_id for r in registrations])
    assert all(e.embedding_codes and len(e.embedding) == DIM for e in entries)
    batch, from_floats, from_codes = (DonorIndex(DIM, 1000, IndexBackend.USEARCH, dtype="i8") for _ in range(3))
    batch.insert_batch([r.donor_id for r in registrations], "ns", np.stack([r.vector() for r in registrations]))
    for registration, entry in zip(registrations, entries, strict=True):
        from_floats.insert(registration.donor_id, "ns", registration.vector())
        from_codes.insert(entry.donor_id, "ns", entry.vector())
    for registration, entry in zip(registrations, entries, strict=True):
        stored = batch.vector(registration.donor_id)
        assert stored is not None and np.array_equal(stored, from_codes.vector(entry.donor_id))
        assert np.array_equal(stored, from_floats.vector(entry.donor_id))  # type: ignore[arg-type]
        assert quantize_i8(stored.reshape(1, -1))[0].tobytes() == entry.embedding  # the index's codes are the entry's
    for query in np.random.default_rng(2).standard_normal((20, DIM)).astype(np.float32):
        assert from_floats.search("ns", query, 8) == from_codes.search("ns", query, 8)


def test_float16_embeddings_become_codes_where_they_have_them_and_codes_become_unit_vectors() -> None:
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((4, 8)).astype(np.float32)
    rows[1] = 0.0  # no direction: no codes
    rows[2, 3] = np.nan
    f16 = [row.astype("<f2").tobytes() for row in rows]
    embeddings = [*f16, b"", rng.integers(-127, 128, 6, dtype=np.int8).tobytes()]
    out, forms = stored_forms(embeddings, [8, 8, 8, 8, 0, 6], [False] * 5 + [True], to_codes=True)
    assert forms == [True, False, False, True, True, True]  # zero and NaN rows stay float16; codes stay codes
    assert out[1:3] == f16[1:3] and out[4:] == embeddings[4:]
    expected, ok = i8_codes(np.stack([np.frombuffer(f16[i], dtype="<f2").astype(np.float32) for i in (0, 3)]))
    assert ok.all() and [out[0], out[3]] == [expected[0].tobytes(), expected[1].tobytes()]
    back, back_forms = stored_forms(out, [8, 8, 8, 8, 0, 6], forms, to_codes=False)
    assert back_forms == [False] * 6 and back[1:5] == [f16[1], f16[2], to_f16(out[3], True), b""]
    for i in (0, 5):
        values = np.frombuffer(back[i], dtype="<f2").astype(np.float32)
        codes = np.frombuffer(out[i], dtype=np.int8).astype(np.float32)
        assert abs(np.linalg.norm(values) - 1.0) < 2e-3
        assert values @ codes / np.linalg.norm(codes) > 0.9999
    original = rows[0] / np.linalg.norm(rows[0])
    assert codes_unit(np.frombuffer(out[0], dtype=np.int8).reshape(1, -1))[0] @ original > 0.999
