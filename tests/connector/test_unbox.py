"""The prompt's u32 conversion in C (trtllm_connector/unbox.c) gives what ``u32_tokens`` gives, errors included.

The extension module is built for this interpreter into a temporary folder (skipped without a C compiler and Python
headers); every case runs through it and through the fallback, and both must equal ``u32_tokens``: the array (typecode
``I``, same items) or the same exception type. The module answers None (nothing raised) for what it does not take as
it is, so ``u32_tokens`` decides those.
"""

from __future__ import annotations

import array
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semblend_dynamo._native.build import compile_library
from semblend_dynamo.events.schemas import request_key, u32_tokens
from trtllm_connector import unbox

REPO = Path(__file__).resolve().parents[2]


def has_compiler() -> bool:
    return shutil.which("cc") is not None and Path(sysconfig.get_paths()["include"], "Python.h").exists()


@pytest.fixture(scope="module")
def unboxer(tmp_path_factory: pytest.TempPathFactory) -> unbox.Unboxer:
    if not has_compiler():
        pytest.skip("no C compiler or no Python headers")
    path = unbox.build(tmp_path_factory.mktemp("unbox") / unbox.module_path().name)
    function, reason = unbox.load(path, unbox.SETUP)
    assert function is not None, reason
    return function


def outcome(convert: Any, tokens: Any) -> tuple[str, Any]:
    try:
        out = convert(tokens)
    except Exception as exc:
        return "raised", type(exc)
    assert isinstance(out, array.array) and out.typecode == "I"
    return "array", out.tolist()


class Int(int):
    pass


class List(list):  # type: ignore[type-arg]
    pass


EDGES = [
    [],
    [0],
    [1, 2, 3],
    [2**30 - 1, 2**30, 2**31, 2**32 - 1],  # one digit, two digits, up to the largest u32
    [2**30 - 1],
    [2**30],
    [2**32 - 1],
    [7] * 5 + [2**32],  # one too large at the end
    [2**32],
    [-1],
    [0, -(2**30)],
    [5, -(2**40)],
    [2**64],
    [True, False, 3],  # bool is an int subclass: not taken as it is, fromlist's answer
    [Int(4), 5],  # another int subclass
    [np.int64(5), 6],  # numpy integers: through __index__, fromlist's answer
    [np.uint32(7)],
    [np.int64(-1)],
    [1.0],
    ["1"],
    [None],
    List([1, 2, 3]),  # a list subclass: u32_tokens
    List([-1]),
    (1, 2, 3),  # not a list: u32_tokens
    np.arange(10, dtype=np.int64),
    range(5),
    None,
    5,
    # buffers, as a binding exposing the request's int32 vector without a list would hand them over
    np.array([0, 5, 2**31 - 1], dtype=np.int32),
    np.array([], dtype=np.int32),
    np.array([3, -1], dtype=np.int32),
    np.array([1, 2, -3], dtype=np.int32),  # an odd count: the last item is read on its own
    np.array([-(2**31), 1, 2], dtype=np.int32),
    np.array([2**32 - 1, 0], dtype=np.uint32),
    np.array([2**32 - 1, 2**32], dtype=np.uint64),
    np.array([1, 2], dtype=">i4"),  # not the native byte order
    np.array([[1, 2], [3, 4]], dtype=np.int32),  # not one-dimensional
    np.arange(10, dtype=np.int32)[::2],  # not contiguous
    np.array([1.0, 2.0]),
    np.array([True, False]),
    memoryview(array.array("i", [4, 5, 6])),
    memoryview(array.array("i", [4, -5])),
    array.array("i", [7, 8]),
    array.array("I", [9]),
    b"\x01\x02",  # bytes: array() reads them as raw bytes, not one item each
]


@pytest.mark.parametrize("tokens", EDGES, ids=[f"case{i}" for i in range(len(EDGES))])
def test_edge_cases_match_u32_tokens(unboxer: unbox.Unboxer, tokens: Any) -> None:
    expected = outcome(u32_tokens, tokens)
    assert outcome(lambda t: unbox.u32_prompt(t, unboxer), tokens) == expected
    assert outcome(lambda t: unbox.u32_prompt(t, None), tokens) == expected


def test_the_module_answers_none_for_what_it_does_not_take(unboxer: unbox.Unboxer) -> None:
    buffers = [np.array([0, 2**31 - 1, 5], dtype=np.int32), memoryview(array.array("I", [2**32 - 1, 7]))]
    for tokens in [[], [0, 2**30 - 1, 2**30, 2**32 - 1], *buffers]:  # buffers of native 4-byte integers: copied
        out = unboxer(tokens)
        assert out is not None and out.typecode == "I" and out.tolist() == list(tokens)
    refused = [
        [2**32],
        [-1],
        [True],
        [Int(1)],
        [np.int64(1)],
        [1.0],
        List([1]),
        (1,),
        None,
        np.arange(3, dtype=np.int64),
    ]
    refused += [
        np.array([1, -1], dtype=np.int32),
        np.array([1], dtype=">u4"),
        np.arange(6, dtype=np.int32)[::2],
        b"abcd",
    ]
    for tokens in refused:
        assert unboxer(tokens) is None, tokens
    assert unboxer([1, 2]) is not unboxer([1, 2])  # a new array each time


def test_an_int32_buffer_is_copied_not_viewed() -> None:
    """A zero-copy view of the request's tokens is converted into an array of its own: the request may change them."""
    held = np.array([1, 2, 3], dtype=np.int32)
    out = unbox.u32_prompt(memoryview(held).toreadonly())
    held[0] = 9
    assert out.typecode == "I" and out.tolist() == [1, 2, 3]


def test_random_prompts_match_u32_tokens_and_give_the_same_request_key(unboxer: unbox.Unboxer) -> None:
    rng = random.Random(3)
    for n in (1, 31, 32, 33, 1000, 8192):
        for high in (255, 32_000, 2**30 + 5, 2**32 - 1):
            tokens = [rng.randrange(0, high + 1) for _ in range(n)]
            out = unbox.u32_prompt(tokens, unboxer)
            assert out == u32_tokens(tokens)
            assert request_key(out) == request_key(tokens)


def test_setup_takes_one_zero_u32_item(tmp_path: Path) -> None:
    if not has_compiler():
        pytest.skip("no C compiler or no Python headers")
    path = unbox.build(tmp_path / unbox.module_path().name)
    for wrong in (array.array("i", [0]), array.array("I", [1]), array.array("I", [0, 0]), b"\0\0\0\0", [0]):
        with pytest.raises(TypeError):
            unbox.load(path, (wrong,))


def test_a_module_built_from_other_source_is_refused(tmp_path: Path) -> None:
    function, reason = unbox.load(tmp_path / "missing.so", unbox.SETUP)
    assert function is None and "not built" in reason
    if not has_compiler():
        pytest.skip("no C compiler or no Python headers")
    other = tmp_path / "unbox.c"
    other.write_text(unbox.SOURCE.read_text() + "\n/* changed */\n")
    out = tmp_path / unbox.module_path().name
    include = sysconfig.get_paths()["include"]
    compile_library(other, out, [f"-I{include}", '-DMODULE_SOURCE_DIGEST="0000000000000000"'])
    function, reason = unbox.load(out, unbox.SETUP)
    assert function is None and "another unbox.c" in reason


def test_status_says_which_path_this_process_uses(capsys: pytest.CaptureFixture[str]) -> None:
    assert unbox.main(["status"]) == 0
    path = "native" if unbox._U32 is not None else "fromlist"
    assert capsys.readouterr().out == f"{path}: {unbox.REASON}\n"


def run_unbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "trtllm_connector.unbox", *args],
        capture_output=True, text=True, timeout=120, env=environ, cwd=REPO, check=False,
    )  # fmt: skip


def test_the_build_command_writes_a_module_the_loader_uses(tmp_path: Path) -> None:
    if not has_compiler():
        pytest.skip("no C compiler or no Python headers")
    out = tmp_path / unbox.module_path().name
    built = run_unbox("build", "--output", str(out), "--cc", "cc")
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == str(out)
    function, reason = unbox.load(out, unbox.SETUP)
    assert function is not None, reason
    failed = run_unbox("build", "--output", str(tmp_path / "x.so"), "--cc", "false")
    assert failed.returncode == 1 and failed.stderr.startswith("error: false failed")


def test_the_off_switch_leaves_fromlist_with_one_info_line() -> None:
    off = run_unbox("status", env={unbox.ENV: "0"})
    assert off.returncode == 0 and off.stdout == f"fromlist: {unbox.ENV}=0\n"
    check = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout);"
        "from trtllm_connector import unbox; print(unbox._U32, unbox.u32_prompt([1, 2]).tolist())"
    )
    environ = {**os.environ, "PYTHONPATH": str(REPO), unbox.ENV: "0"}
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=environ, check=True)
    assert proc.stdout.splitlines() == [
        f"INFO:trtllm_connector.unbox:prompt unboxing: array.fromlist ({unbox.ENV}=0)",
        "None [1, 2]",
    ]
