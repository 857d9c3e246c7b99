"""A donor embedding's two stored forms: float16 values, or the int8 codes an i8 donor index keeps.

The i8 index (:mod:`semblend_dynamo.donor_index`, cosine metric) stores each unit vector as int8 codes scaled so its
largest component is +-127, with no scale kept; codes rescaled to any length quantize back to themselves. So a
catalog whose index is i8 needs nothing but the codes of a donor's embedding (1 byte a dimension instead of 2), and
the codes it keeps are exactly what the index would store from the float vector (:func:`i8_codes` is the index's own
arithmetic).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """float32 rows of nonzero finite norm, each divided by its L2 norm (the donor index's normalisation)."""
    return np.ascontiguousarray(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=np.float32)


def quantize_i8(rows: np.ndarray) -> np.ndarray:
    """Nonzero float32 rows as int8 codes, each row scaled so its largest absolute component is 127 (cosine-preserving:
    the scale is per row). Codes rescaled to any length quantize back to themselves."""
    scale = np.float32(127.0) / np.abs(rows).max(axis=1, keepdims=True)
    return np.rint(rows * scale).astype(np.int8)


def i8_codes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The codes an i8 index stores for float32 ``rows`` (normalised, then quantized) and which rows have them (a row
    of zero or non-finite norm has none: its codes row is zeros)."""
    rows = np.asarray(rows, dtype=np.float32)
    with np.errstate(all="ignore"):
        norms = np.linalg.norm(rows, axis=1)
    ok = np.isfinite(norms) & (norms > 1e-12) & np.isfinite(rows).all(axis=1)
    codes = np.zeros(rows.shape, dtype=np.int8)
    if ok.any():
        codes[ok] = quantize_i8(unit_rows(rows[ok]))
    return codes, ok


def codes_unit(codes: np.ndarray) -> np.ndarray:
    """int8 code rows as float32 unit rows (a row of zeros stays zeros)."""
    values = np.asarray(codes, dtype=np.float32)
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    return values / np.where(norms > 0, norms, np.float32(1.0))


def as_vector(embedding: bytes, codes: bool) -> np.ndarray:
    """One stored embedding as float32: float16 values as they are, int8 codes rescaled to unit length."""
    if codes:
        return codes_unit(np.frombuffer(embedding, dtype=np.int8).reshape(1, -1))[0]
    return np.frombuffer(embedding, dtype="<f2").astype(np.float32)


def to_f16(embedding: bytes, codes: bool) -> bytes:
    """One stored embedding as float16 bytes (int8 codes as their unit vector)."""
    return embedding if not codes else as_vector(embedding, True).astype("<f2").tobytes()


def stored_forms(
    embeddings: Sequence[bytes], dims: Sequence[int], codes: Sequence[bool], to_codes: bool
) -> tuple[list[bytes], list[bool]]:
    """Embeddings (each float16 or int8 codes, as ``codes`` says) in the form ``to_codes`` asks, with each one's
    form: float16 becomes codes (:func:`i8_codes`; one without codes stays float16), codes become their unit vector in
    float16; an empty one takes the form asked). Rows of one dimension convert together."""
    out, forms = list(embeddings), list(codes)
    by_dim: dict[int, list[int]] = {}
    for i, (dim, form) in enumerate(zip(dims, codes, strict=True)):
        if not dim:
            forms[i] = to_codes
        elif form != to_codes:
            by_dim.setdefault(dim, []).append(i)
    for dim, rows in by_dim.items():
        joined = b"".join(out[i] for i in rows)
        if to_codes:
            new, ok = i8_codes(np.frombuffer(joined, dtype="<f2").reshape(len(rows), dim).astype(np.float32))
        else:
            new = codes_unit(np.frombuffer(joined, dtype=np.int8).reshape(len(rows), dim)).astype("<f2")
            ok = np.ones(len(rows), dtype=bool)
        for i, row, converted in zip(rows, new, ok.tolist(), strict=True):
            if converted:
                out[i], forms[i] = row.tobytes(), to_codes
    return out, forms
