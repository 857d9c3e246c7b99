"""The prompt's u32 conversion in C (trtllm_connector/unbox.c) gives what ``u32_tokens`` gives, errors included.

The library is built for this interpreter into a temporary folder (skipped without a C compiler and Python headers);
every case runs through it and through the fallback, and both must equal ``u32_tokens``: the array (typecode ``I``,
same items) or the same exception type.
"""

from __future__ import annotations

import array
import random
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semblend_dynamo.events.schemas import request_key, u32_tokens
from trtllm_connector import unbox


@pytest.fixture(scope="module")
def unboxer(tmp_path_factory: pytest.TempPathFactory) -> unbox.Unboxer:
    if shutil.which("cc") is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("no C compiler or no Python headers")
    path = unbox.build(tmp_path_factory.mktemp("unbox") / "libunbox.so")
    function, reason = unbox.load(path)
    assert function is not None, reason
    return function


def outcome(convert: Any, tokens: Any) -> tuple[str, Any]:
    try:
        out = convert(tokens)
    except Exception as exc:
        return "raised", type(exc)
    assert isinstance(out, array.array) and out.typecode == "I"
    return "array", out.tolist()


EDGES = [
    [],
    [0],
    [1, 2, 3],
    [2**30 - 1, 2**30, 2**31, 2**32 - 1],  # one digit, two digits, up to the largest u32
    [7] * 5 + [2**32],  # one too large at the end
    [-1],
    [5, -(2**40)],
    [2**64],
    [True, False, 3],  # bool is an int subclass: not taken as it is, fromlist's answer
    [np.int64(5), 6],  # numpy integers: through __index__, fromlist's answer
    [np.uint32(7)],
    [1.0],
    ["1"],
    [None],
    (1, 2, 3),  # not a list: u32_tokens
    np.arange(10, dtype=np.int64),
    range(5),
]


@pytest.mark.parametrize("tokens", EDGES, ids=[f"case{i}" for i in range(len(EDGES))])
def test_edge_cases_match_u32_tokens(unboxer: unbox.Unboxer, tokens: Any) -> None:
    expected = outcome(u32_tokens, tokens)
    assert outcome(lambda t: unbox.u32_prompt(t, unboxer), tokens) == expected
    assert outcome(lambda t: unbox.u32_prompt(t, None), tokens) == expected


def test_random_prompts_match_u32_tokens_and_give_the_same_request_key(unboxer: unbox.Unboxer) -> None:
    rng = random.Random(3)
    for n in (1, 31, 32, 33, 1000, 8192):
        for high in (255, 32_000, 2**30 + 5, 2**32 - 1):
            tokens = [rng.randrange(0, high + 1) for _ in range(n)]
            out = unbox.u32_prompt(tokens, unboxer)
            assert out == u32_tokens(tokens)
            assert request_key(out) == request_key(tokens)


def test_a_library_built_from_other_source_is_refused(tmp_path: Path) -> None:
    function, reason = unbox.load(tmp_path / "missing.so")
    assert function is None and "not built" in reason
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    stale = tmp_path / "stale.c"
    stale.write_text('const char *ub_source_digest(void) { return "0"; }\nint ub_u32(void) { return -1; }\n')
    library = tmp_path / "libstale.so"
    import subprocess

    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(stale)], check=True)
    function, reason = unbox.load(library)
    assert function is None and "another unbox.c" in reason


def test_a_library_whose_source_is_not_installed_is_not_used(
    unboxer: unbox.Unboxer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = unbox.build(tmp_path / "libunbox.so")

    def gone() -> str:
        raise FileNotFoundError("unbox.c")

    monkeypatch.setattr(unbox, "source_digest", gone)
    function, reason = unbox.load(path)
    assert function is None and reason.startswith("cannot check libunbox.so against its source")


def test_status_says_which_path_this_process_uses(capsys: pytest.CaptureFixture[str]) -> None:
    assert unbox.main(["status"]) == 0
    path = "native" if unbox._UB_U32 is not None else "fromlist"
    assert capsys.readouterr().out == f"{path}: {unbox.REASON}\n"
