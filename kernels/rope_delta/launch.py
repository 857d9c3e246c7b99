"""The public RoPE-delta entry points: check the plan, then enqueue a Triton kernel, or run the torch reference
where Triton cannot run."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..layout import PagedKVLayout
from . import triton_kernels
from .plan import COPY_PLAN_COLUMNS, INPLACE_PLAN_COLUMNS, CheckedPlan, RopeStyle, check_plan
from .reference import run_copy_reference, run_inplace_reference
from .triton_kernels import INTERPRETED, triton
from .tuning import KernelTuning, default_tuning


def uses_triton(pool: torch.Tensor) -> bool:
    """Whether the public functions run the Triton kernels (not the torch reference) for ``pool``."""
    return triton is not None and (pool.is_cuda or INTERPRETED)


def rope_delta_copy(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
    tuning: KernelTuning | None = None,
) -> None:
    """Materialize donor KV into target blocks per ``plan`` (``[S, 6]``), rotating K by each row's delta.

    Called on the forward stream before the target's prefill reads its blocks; enqueues work and returns (no sync
    beyond validating ``plan``). fp8 (``torch.float8_e4m3fn``) pools need ``kv_scale``, the cache's dequantization
    scale (fp32 ``[num_layers]`` or ``[1]``, on the pool's device); other dtypes take none. Raises `InvalidPlan`,
    `UnsupportedLayout` or `UnsupportedKVDtype` before touching the pool.
    """
    checked = check_plan(pool, plan, inv_freq, layout, rotary_dim, style, layers, COPY_PLAN_COLUMNS, kv_scale)
    if uses_triton(pool):
        tuning = tuning or default_tuning(pool.dtype, "copy", _head_blocks(checked, layout))
        _launch_copy(pool, checked, layout, rotary_dim, style, tuning)
    else:
        run_copy_reference(pool, checked, layout, rotary_dim, style)


def rope_delta_inplace(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
    tuning: KernelTuning | None = None,
) -> None:
    """Rotate K of the slots in ``plan`` (``[S, 4]``) in place by each row's delta; V is left alone.

    Never call this on donor blocks that other requests may read: write into the target's own blocks. ``kv_scale``
    as for `rope_delta_copy`.
    """
    checked = check_plan(pool, plan, inv_freq, layout, rotary_dim, style, layers, INPLACE_PLAN_COLUMNS, kv_scale)
    if uses_triton(pool):
        tuning = tuning or default_tuning(pool.dtype, "inplace", _head_blocks(checked, layout))
        _launch_inplace(pool, checked, layout, rotary_dim, style, tuning)
    else:
        run_inplace_reference(pool, checked, layout, rotary_dim, style)


def _launch_copy(
    pool: torch.Tensor, c: CheckedPlan, layout: PagedKVLayout, rotary_dim: int, style: str, tune: KernelTuning
) -> Any:
    """Enqueue the copy kernel for an already validated plan (the benchmark times this alone); returns what Triton's
    launch returns (on the GPU the compiled kernel, whose register count the benchmark prints)."""
    if c.plan.shape[0] == 0:
        return None
    stride_b, stride_l, stride_kv, stride_h, stride_t = layout.kernel_strides(pool)
    tiles, grid = triton_kernels.rope_delta_copy_tiles_kernel, triton_kernels.rope_delta_copy_kernel
    kernel = tiles if tune.load_all_tiles else grid
    return kernel[_grid(c, layout, tune, 2)](
        pool,
        c.plan,
        c.groups,
        c.inv_freq,
        c.layer_start,
        c.layer_stop,
        tune.layers_per_program,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        layout.num_kv_heads,
        _heads_per_program(layout, tune),
        num_warps=tune.num_warps,
        **_meta(layout, rotary_dim, style, tune, group_axis=_group_axis(c, tune)),
        HEAD_DIM=layout.head_dim,
        **({"BLOCK_D": triton.next_power_of_2(layout.head_dim)} if tune.load_all_tiles else {}),
        **({"ONE_TRIP_START": True} if tune.one_trip_start and tune.load_all_tiles else {}),
    )


def _launch_inplace(
    pool: torch.Tensor, c: CheckedPlan, layout: PagedKVLayout, rotary_dim: int, style: str, tune: KernelTuning
) -> Any:
    """Enqueue the in-place kernel for an already validated plan; returns what Triton's launch returns."""
    if c.plan.shape[0] == 0:
        return None
    stride_b, stride_l, _, stride_h, stride_t = layout.kernel_strides(pool)
    tiles, grid = triton_kernels.rope_delta_inplace_tiles_kernel, triton_kernels.rope_delta_inplace_kernel
    kernel = tiles if tune.load_all_tiles else grid
    return kernel[_grid(c, layout, tune, 1)](
        pool,
        c.plan,
        c.groups,
        c.inv_freq,
        c.layer_start,
        c.layer_stop,
        tune.layers_per_program,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        layout.num_kv_heads,
        _heads_per_program(layout, tune),
        num_warps=tune.num_warps,
        **_meta(layout, rotary_dim, style, tune, group_axis=_group_axis(c, tune)),
        **({"ONE_TRIP_START": True} if tune.one_trip_start else {}),
        **_prefetch_step(pool, layout, tune),
    )


def _prefetch_step(pool: torch.Tensor, layout: PagedKVLayout, tune: KernelTuning) -> dict[str, Any]:
    """The in-place one-trip program's `KernelTuning.l2_prefetch` argument where the pool allows it; none otherwise
    (the kernel then compiles as without it). Bytes per element: the bulk prefetch is sm_90 PTX (compiled kernels
    on a GPU of compute capability 9.0 or later, not the interpreter), and it needs the program's heads contiguous and
    16-byte aligned (head-major; a tile of tokens x head_dim a multiple of 16 bytes)."""
    item = pool.element_size()
    fits = (
        tune.l2_prefetch
        and not INTERPRETED
        and _has_bulk_prefetch(pool.device)
        and layout.order == "head_major"
        and pool.data_ptr() % 16 == 0
        and layout.tokens_per_block * layout.head_dim * item % 16 == 0
    )
    return {"PREFETCH_ELEM_BYTES": item} if fits else {}


def _head_blocks(c: CheckedPlan, layout: PagedKVLayout) -> int:
    return c.groups.shape[0] * (c.layer_stop - c.layer_start) * layout.num_kv_heads


def _heads_per_program(layout: PagedKVLayout, tune: KernelTuning) -> int:
    return min(tune.heads_per_program or layout.num_kv_heads, layout.num_kv_heads)


def _grid(c: CheckedPlan, layout: PagedKVLayout, tune: KernelTuning, kv: int) -> tuple[int, int, int]:
    """One program per (row group, run of layers, K|V x run of heads); `_group_axis` says which axis counts groups."""
    groups = c.groups.shape[0]
    layer_runs = triton.cdiv(c.layer_stop - c.layer_start, tune.layers_per_program)
    head_runs = triton.cdiv(layout.num_kv_heads, _heads_per_program(layout, tune))
    if _group_axis(c, tune) == 1:
        return layer_runs, groups, kv * head_runs
    return groups, layer_runs, kv * head_runs


_MAX_GRID_Y = 65535
"""CUDA's limit on a grid's second dimension (the first allows 2**31 - 1)."""


def _group_axis(c: CheckedPlan, tune: KernelTuning) -> int:
    """The grid axis that counts row groups: 1 with `KernelTuning.layers_fastest` (layer runs on axis 0, dispatched
    first), unless there are more groups than axis 1 allows; 0 otherwise."""
    return 1 if tune.layers_fastest and c.groups.shape[0] <= _MAX_GRID_Y else 0


@functools.cache
def _has_bulk_prefetch(device: torch.device) -> bool:
    """Whether ``cp.async.bulk.prefetch.L2`` exists on ``device`` (sm_90 and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def _meta(
    layout: PagedKVLayout, rotary_dim: int, style: str, tune: KernelTuning, *, group_axis: int = 0
) -> dict[str, Any]:
    registers = {} if tune.max_registers is None else {"maxnreg": tune.max_registers}
    common: dict[str, Any] = {
        "ROTARY_DIM": rotary_dim,
        "BLOCK_T": triton.next_power_of_2(layout.tokens_per_block),
        "BLOCK_HALF": triton.next_power_of_2(rotary_dim // 2),
        "IS_NEOX": style == "neox",
        "INTERPRETED": INTERPRETED,
        "GROUP_AXIS": group_axis,
    }
    if tune.load_all_tiles:  # the tile count is fixed per layout and tuning (not per call: no recompiles)
        tiles = min(tune.layers_per_program, layout.num_layers) * _heads_per_program(layout, tune)
        return registers | common | {"TILES": triton.next_power_of_2(tiles)}
    return registers | common
