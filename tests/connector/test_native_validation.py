"""validate_load's compiled passing path (trtllm_connector/validation.c) passes exactly what validate_load passes.

The module is built for this interpreter into a temporary folder (skipped without a C compiler and Python headers).
On seeded random registries (donors sharing runs with the prompt, approximate donors, another namespace, released
ones), spans (matching, moved, mismatching, overlapping, out of order), device prefixes and flags, its answer is None
exactly when validate_load raises Declined, and otherwise validate_load's load: the same start, tokens, rotation,
lineage and segments (the registry's own donor objects, generations, offsets, exactness).
"""

from __future__ import annotations

import random
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.policy import Lineage
from semblend_dynamo.span_aligner import Span
from trtllm_connector import native_validation, validation
from trtllm_connector.donors import DonorRegistry
from trtllm_connector.validation import Declined, Segment, ValidatedLoad, validate_load

TPB = 8
NS = NamespaceKey(model_id="m", tokens_per_block=TPB)
OTHER = NamespaceKey(model_id="other", tokens_per_block=TPB)
SETUP = (Segment, ValidatedLoad, Lineage.EXACT)


@pytest.fixture(scope="module")
def native_load(tmp_path_factory: pytest.TempPathFactory) -> native_validation.Load:
    if shutil.which("cc") is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("no C compiler or no Python headers")
    name = native_validation.module_path().name
    function, reason = native_validation.load(native_validation.build(tmp_path_factory.mktemp("v") / name), SETUP)
    assert function is not None, reason
    return function


def summary(load: ValidatedLoad) -> tuple[Any, ...]:
    segments = tuple(
        (id(s.donor), s.generation, s.donor_start, s.target_start, s.length, s.exact_equivalent) for s in load.segments
    )
    return load.start, load.tokens, load.requires_rope_correction, load.lineage, segments


def python_load(*args: Any, **kwargs: Any) -> ValidatedLoad | Declined:
    saved, validation.NATIVE_LOAD = validation.NATIVE_LOAD, None
    try:
        return validate_load(*args, **kwargs)
    except Declined as declined:
        return declined
    finally:
        validation.NATIVE_LOAD = saved


def test_random_loads_pass_where_validate_load_passes(native_load: native_validation.Load) -> None:
    rng = random.Random(20261127)
    passed = declined = rotated = several = 0
    for case in range(8000):
        base = [rng.randrange(1, 50) for _ in range(400)]
        reg = DonorRegistry(10_000, 60.0, tokens_per_block=TPB)
        ids = []
        for k in range(3):
            start = rng.choice([0, 0, 5, 40])
            tokens = base[start : start + rng.randrange(40, 300)]
            lineage = Lineage.APPROXIMATE if rng.random() < 0.2 else Lineage.EXACT
            ns = OTHER if rng.random() < 0.1 else NS
            blocks = -(-len(tokens) // TPB) - (1 if rng.random() < 0.05 else 0)
            donor = reg.admit(100 * case + k, ns, tokens, list(range(1000 * k, 1000 * k + blocks)), lineage).donor
            assert donor is not None
            ids.append((donor.donor_id, start))
        if rng.random() < 0.1:
            reg.evict(ids[0][0])
        offset = rng.choice([0, 0, 0, 3, 16, 37])
        target = np.array(base[offset : offset + rng.randrange(32, 360)], dtype=np.uint32)
        if rng.random() < 0.15:
            target[rng.randrange(len(target))] = 99  # a token no donor holds
        spans = []
        pos = 0
        for _ in range(rng.randint(1, 4)):
            donor_id, donor_offset = rng.choice([*ids, *ids, *ids, ("gone", 0)])
            length = rng.choice([8 * rng.randint(1, 20), rng.randint(1, 150)])
            # Where the prompt's tokens sit in this donor (base offset - the donor's start), or somewhere else.
            donor_start = max(0, pos + offset - donor_offset + rng.choice([0, 0, 0, 0, 0, 0, 1, -8]))
            spans.append(Span(donor_id, donor_start, pos, length))
            pos = max(0, pos + length + rng.choice([0, 0, 0, -3, 5]))
        rng.shuffle(spans)
        args = (target, rng.choice([0, 0, 0, 0, 8, 16, 3]), spans, reg)
        kwargs = {
            "namespace_digest": NS.digest(),
            "tokens_per_block": TPB,
            "exact_only": rng.random() < 0.25,
            "shift_supported": rng.random() < 0.8,
            "tokens_checked": rng.random() < 0.2,
        }
        expected = python_load(*args, **kwargs)
        got = native_load(*args, *kwargs.values())
        if isinstance(expected, Declined):
            assert got is None, (case, expected)
            declined += 1
            continue
        assert isinstance(got, ValidatedLoad) and summary(got) == summary(expected), case
        passed += 1
        rotated += expected.requires_rope_correction
        several += len(expected.segments) > 1
    assert passed > 1000 and declined > 1000 and rotated > 400 and several > 200, (passed, declined, rotated, several)


def test_inputs_it_does_not_take_as_they_are_go_to_validate_load(native_load: native_validation.Load) -> None:
    reg = DonorRegistry(100, 60.0, tokens_per_block=TPB)
    donor = reg.admit(1, NS, list(range(1, 33)), [0, 1, 2, 3]).donor
    assert donor is not None
    target = np.arange(1, 41, dtype=np.uint32)
    span = Span(donor.donor_id, 0, 0, 32)
    flags = (NS.digest(), TPB, True, True, False)
    assert native_load(target, 0, [span], reg, *flags) is not None
    assert native_load(target.astype(np.int64), 0, [span], reg, *flags) is None  # another width: validate_load's call
    assert native_load(target[::2], 0, [span], reg, *flags) is None  # not contiguous
    assert native_load(target, np.int64(0), [span], reg, *flags) is None
    assert native_load(target, 0, iter([span]), reg, *flags) is None
    assert native_load(target, 0, [span] * 65, reg, *flags) is None
    assert native_load(target, 0, [], reg, *flags) is None


def test_status_says_what_validation_decided(capsys: pytest.CaptureFixture[str]) -> None:
    assert native_validation.main(["status"]) == 0
    used = "native" if validation.NATIVE_LOAD is not None else "python"
    assert capsys.readouterr().out == f"{used}: {validation.NATIVE_REASON}\n"
