"""GPU preflight: the decision from plain GPU facts, the launcher's use of it, and cuda-python on a real GPU."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from trtllm_connector import launcher, preflight
from trtllm_connector.preflight import GIB, GpuFacts, WorkerNeeds

H100 = GpuFacts(
    index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), driver_cuda_version=12080,
    runtime_cuda_version=12080, free_bytes=79 * GIB, total_bytes=80 * GIB,
)  # fmt: skip
T4 = dataclasses.replace(H100, name="Tesla T4", compute_capability=(7, 5), free_bytes=14 * GIB, total_bytes=15 * GIB)
A100 = dataclasses.replace(H100, name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0))
EXACT = WorkerNeeds(triton_kernels=True, fp8_kv=False, pin_budget_fraction=0.1, free_gpu_memory_fraction=0.85)


def test_a_hopper_gpu_passes_every_check() -> None:
    assert preflight.problems([H100], dataclasses.replace(EXACT, fp8_kv=True)) == []


def test_triton_kernels_need_sm80() -> None:
    (line,) = preflight.problems([T4], EXACT)
    assert "sm75" in line and "sm80" in line and "discovery_only" in line
    assert preflight.problems([T4], dataclasses.replace(EXACT, triton_kernels=False)) == []


def test_fp8_kv_needs_sm89() -> None:
    (line,) = preflight.problems([A100], dataclasses.replace(EXACT, fp8_kv=True))
    assert "FP8" in line and "sm89" in line and "GPU 0" in line


def test_pin_budget_must_fit_in_free_memory() -> None:
    busy = dataclasses.replace(H100, free_bytes=5 * GIB)  # another process holds most of the GPU
    (line,) = preflight.problems([busy], EXACT)  # 0.1 * 0.85 * 80 GiB = 6.8 GiB > 5 GiB
    assert "6.8 GiB" in line and "5.0 GiB free" in line and "pin_budget_fraction" in line
    assert preflight.problems([busy], dataclasses.replace(EXACT, pin_budget_fraction=0.05)) == []


def test_every_gpu_is_checked() -> None:
    second = dataclasses.replace(T4, index=1)
    assert [p.split(":")[0] for p in preflight.problems([H100, second], EXACT)] == ["GPU 1 (Tesla T4, sm75)"]


def test_describe_is_one_line_of_facts() -> None:
    assert preflight.describe(H100) == (
        "GPU 0: NVIDIA H100 80GB HBM3, sm90, driver CUDA 12.8, runtime CUDA 12.8, 79.0/80.0 GiB free"
    )


def _facts_reader(gpus: list[GpuFacts]):
    """Stand-in for the cuda-python reader: returns fixed facts instead of asking the driver."""
    return lambda: gpus


def test_dry_run_prints_the_preflight(monkeypatch, capsys) -> None:
    monkeypatch.setattr(preflight, "read_gpu_facts", _facts_reader([H100]))
    assert launcher.main(["serve", "m", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# preflight\nGPU 0: NVIDIA H100 80GB HBM3, sm90") and "preflight passed" in out


def test_what_cannot_work_is_refused_in_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(preflight, "read_gpu_facts", _facts_reader([T4]))
    assert launcher.main(["serve", "m", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "sm80" in err
    assert launcher.main(["serve", "m", "--dry-run", "--mode", "discovery_only"]) == 0
    assert launcher.main(["serve", "m", "--dry-run", "--kv-dtype", "fp8", "--mode", "discovery_only"]) == 2
    assert "sm89" in capsys.readouterr().err


def test_fp8_in_the_user_yaml_counts(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(preflight, "read_gpu_facts", _facts_reader([A100]))
    user = tmp_path / "fp8.yaml"
    user.write_text("kv_cache_config:\n  dtype: fp8\n")
    assert launcher.main(["serve", "m", "--dry-run", "--extra_llm_api_options", str(user)]) == 2
    assert "FP8" in capsys.readouterr().err


def _gpu_present() -> bool:
    try:
        preflight.read_gpu_facts()
    except preflight.PreflightUnavailable:
        return False
    return True


@pytest.mark.skipif(_gpu_present(), reason="this machine has a GPU")
def test_without_a_gpu_dry_run_says_so_and_carries_on_but_preflight_refuses() -> None:
    cmd = [sys.executable, "-m", "trtllm_connector.launcher"]
    dry = subprocess.run([*cmd, "serve", "m", "--dry-run"], capture_output=True, text=True, timeout=60, check=True)
    assert dry.stdout.splitlines()[:2] == ["# preflight", dry.stdout.splitlines()[1]]
    assert dry.stdout.splitlines()[1].startswith("preflight skipped: ") and dry.stderr == ""
    check = subprocess.run([*cmd, "preflight"], capture_output=True, text=True, timeout=60)
    assert check.returncode == 2 and check.stdout == "" and len(check.stderr.strip().splitlines()) == 1


def test_without_cuda_python_the_reader_says_so(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(preflight.PreflightUnavailable, match="cuda-python is not installed"):
        preflight.read_gpu_facts()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_present(), reason="needs a CUDA GPU and cuda-python")
def test_reads_a_real_gpu() -> None:
    gpus = preflight.read_gpu_facts()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert gpus and (visible is None or len(gpus) == len(visible.split(",")))
    for gpu in gpus:
        assert gpu.compute_capability >= (3, 0) and 0 < gpu.free_bytes <= gpu.total_bytes
        assert gpu.driver_cuda_version >= 11000 and gpu.name
    print("\n".join(preflight.describe(g) for g in gpus))
