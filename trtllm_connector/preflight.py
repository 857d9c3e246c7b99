"""Worker preflight: read the GPU's facts through ``cuda-python`` and refuse, in one line, what cannot work.

Checked before a TensorRT-LLM worker starts (``semblend-trtllm serve``, ``semblend-trtllm preflight``):

- materialization runs Triton kernels (RoPE-delta copy), which need compute capability >= 8.0;
- an FP8 KV cache needs compute capability >= 8.9;
- the donor pin budget (a share of the KV pool the engine will size on this GPU) must fit in free memory.

:func:`read_gpu_facts` is the only part that touches the driver; :func:`problems` decides from plain
:class:`GpuFacts`, so the decision is testable without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TRITON_MIN_CC = (8, 0)
FP8_KV_MIN_CC = (8, 9)
GIB = 1 << 30


@dataclass(frozen=True)
class GpuFacts:
    """What the driver says about one visible GPU."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    driver_cuda_version: int
    """``cuDriverGetVersion``: the newest CUDA the installed driver supports, e.g. 12080 for 12.8."""
    runtime_cuda_version: int
    """``cudaRuntimeGetVersion`` of the CUDA runtime cuda-python binds."""
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class WorkerNeeds:
    """What the configured worker will ask of every GPU it runs on."""

    triton_kernels: bool
    """Donor KV is materialized (any mode but discovery_only)."""
    fp8_kv: bool
    pin_budget_fraction: float
    free_gpu_memory_fraction: float

    def pin_budget_bytes(self, gpu: GpuFacts) -> int:
        """Donor pins may hold this share of the KV pool TensorRT-LLM sizes from this GPU's memory."""
        return int(self.pin_budget_fraction * self.free_gpu_memory_fraction * gpu.total_bytes)


class PreflightUnavailable(Exception):
    """No facts could be read (no cuda-python, no driver, no GPU); the message is one line."""


def cuda_version(encoded: int) -> str:
    """``12080`` -> ``"12.8"`` (CUDA's 1000 * major + 10 * minor encoding)."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def problems(gpus: Sequence[GpuFacts], needs: WorkerNeeds) -> list[str]:
    """One line per thing that cannot work on these GPUs; empty when the worker may start."""
    out = []
    for gpu in gpus:
        where = f"GPU {gpu.index} ({gpu.name}, sm{gpu.compute_capability[0]}{gpu.compute_capability[1]})"
        if needs.triton_kernels and gpu.compute_capability < TRITON_MIN_CC:
            out.append(
                f"{where}: the Triton materialization kernels need sm80 or newer; run with --mode discovery_only"
            )
        if needs.fp8_kv and gpu.compute_capability < FP8_KV_MIN_CC:
            out.append(f"{where}: an FP8 KV cache needs sm89 or newer; use a bfloat16 or float16 KV cache")
        budget = needs.pin_budget_bytes(gpu)
        if budget > gpu.free_bytes:
            out.append(
                f"{where}: the donor pin budget {budget / GIB:.1f} GiB (pin_budget_fraction "
                f"{needs.pin_budget_fraction:g} of a {needs.free_gpu_memory_fraction:g} KV share of "
                f"{gpu.total_bytes / GIB:.1f} GiB) exceeds the {gpu.free_bytes / GIB:.1f} GiB free; "
                "free the GPU or lower pin_budget_fraction"
            )
    return out


def describe(gpu: GpuFacts) -> str:
    """One line of facts, as ``--dry-run`` prints it."""
    major, minor = gpu.compute_capability
    return (
        f"GPU {gpu.index}: {gpu.name}, sm{major}{minor}, driver CUDA {cuda_version(gpu.driver_cuda_version)}, "
        f"runtime CUDA {cuda_version(gpu.runtime_cuda_version)}, "
        f"{gpu.free_bytes / GIB:.1f}/{gpu.total_bytes / GIB:.1f} GiB free"
    )


def _ok(result: tuple, call: str) -> tuple:
    err, *values = result
    if int(err) != 0:
        raise PreflightUnavailable(f"{call} failed: {getattr(err, 'name', err)}")
    return tuple(values)


def read_gpu_facts() -> list[GpuFacts]:
    """Facts of every visible GPU (``CUDA_VISIBLE_DEVICES`` applies); :class:`PreflightUnavailable` if none."""
    try:
        from cuda.bindings import driver, runtime
    except ImportError:
        raise PreflightUnavailable("cuda-python is not installed (pip install 'semblend-dynamo[preflight]')") from None
    try:
        _ok(driver.cuInit(0), "cuInit")
    except PreflightUnavailable:
        raise
    except Exception as exc:  # cuda-python raises its own loader errors when there is no driver library
        raise PreflightUnavailable(f"no NVIDIA driver ({type(exc).__name__})") from None
    (count,) = _ok(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if count == 0:
        raise PreflightUnavailable("no CUDA GPU is visible")
    (driver_version,) = _ok(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    (runtime_version,) = _ok(runtime.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    attr = driver.CUdevice_attribute
    gpus = []
    for index in range(count):
        (dev,) = _ok(driver.cuDeviceGet(index), "cuDeviceGet")
        (major,) = _ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc")
        (minor,) = _ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc")
        (name,) = _ok(driver.cuDeviceGetName(128, dev), "cuDeviceGetName")
        _ok(runtime.cudaSetDevice(index), "cudaSetDevice")
        free, total = _ok(runtime.cudaMemGetInfo(), "cudaMemGetInfo")
        gpus.append(
            GpuFacts(
                index=index,
                name=name.split(b"\0", 1)[0].decode(errors="replace"),
                compute_capability=(int(major), int(minor)),
                driver_cuda_version=int(driver_version),
                runtime_cuda_version=int(runtime_version),
                free_bytes=int(free),
                total_bytes=int(total),
            )
        )
    return gpus
