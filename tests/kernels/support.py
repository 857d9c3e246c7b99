"""Shared helpers for the kernel tests: the devices the Triton kernels can run on here, and a 1-ulp comparison."""

from __future__ import annotations

import pytest
import torch
from semblend_kernels.rope_delta import uses_triton

_INTERPRETER_ON = uses_triton(torch.empty(0))
_CUDA_COMPILED = torch.cuda.is_available() and not _INTERPRETER_ON

# CPU runs the kernels through Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py);
# CUDA runs the compiled kernels (export TRITON_INTERPRET=0 on a GPU machine).
TRITON_DEVICES = [
    pytest.param("cpu", id="interpreter", marks=pytest.mark.skipif(not _INTERPRETER_ON, reason="TRITON_INTERPRET off")),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not _CUDA_COMPILED, reason="needs CUDA and TRITON_INTERPRET=0")],
    ),
]


def assert_within_one_ulp(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to one unit in the last place of the storage dtype (fp32 rounding order may differ)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    a, e = actual.double(), expected.double()
    tol = torch.finfo(actual.dtype).eps * torch.maximum(a.abs(), e.abs()) + 1e-5
    worst = ((a - e).abs() - tol).max().item()
    assert worst <= 0, f"kernel and reference differ by more than one ulp (excess {worst:.3g})"
