"""The torch reference (CPU or GPU): the kernels' oracle in the tests, and the fallback where Triton cannot run."""

from __future__ import annotations

import torch

from ..layout import FP8_KV_DTYPE, PagedKVLayout
from .plan import COPY_PLAN_COLUMNS, INPLACE_PLAN_COLUMNS, CheckedPlan, RopeStyle, check_plan

FP8_MAX = 448.0  # the largest finite e4m3fn value


def rope_delta_copy_reference(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Torch implementation of `rope_delta_copy` (same contract), vectorized gather -> fp32 rotate -> scatter."""
    checked = check_plan(pool, plan, inv_freq, layout, rotary_dim, style, layers, COPY_PLAN_COLUMNS, kv_scale)
    run_copy_reference(pool, checked, layout, rotary_dim, style)


def rope_delta_inplace_reference(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    *,
    rotary_dim: int,
    style: RopeStyle = "neox",
    layers: tuple[int, int] | None = None,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """Torch implementation of `rope_delta_inplace` (same contract)."""
    checked = check_plan(pool, plan, inv_freq, layout, rotary_dim, style, layers, INPLACE_PLAN_COLUMNS, kv_scale)
    run_inplace_reference(pool, checked, layout, rotary_dim, style)


def rotate_reference(
    x: torch.Tensor,
    delta: torch.Tensor,
    inv_freq: torch.Tensor,
    rotary_dim: int,
    style: str,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate ``x`` (``[N, ..., D]``; math in fp32) by per-row position deltas ``delta`` ``[N]``; a new tensor.

    fp8 ``x`` needs ``scale`` (fp32, broadcastable to ``x[..., :1]``): its rotary channels are dequantized with it,
    rotated, and requantized with it (nearest even, saturating). Channels past ``rotary_dim`` are kept as they are.
    """
    theta = delta.to(torch.float32)[:, None] * inv_freq.to(device=x.device, dtype=torch.float32)[None, :]
    shape = (theta.shape[0],) + (1,) * (x.dim() - 2) + (theta.shape[1],)
    cos, sin = theta.cos().reshape(shape), theta.sin().reshape(shape)
    r = x[..., :rotary_dim].to(torch.float32)
    if scale is not None:
        r = r * scale
    half = rotary_dim // 2
    if style == "neox":
        x1, x2 = r[..., :half], r[..., half:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    if scale is not None:
        out = out * torch.reciprocal(scale)
    result = _as_bytes(x.clone())
    result[..., :rotary_dim] = _as_bytes(_to_storage_reference(out, x.dtype))
    return result.view(x.dtype)


def _to_storage_reference(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == FP8_KV_DTYPE:
        x = x.clamp(-FP8_MAX, FP8_MAX)  # torch's fp8 cast rounds to nearest even; TensorRT-LLM saturates
    return x.to(dtype)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors as uint8 (gathers, scatters and slices move bytes, whatever torch supports for fp8)."""
    return t.view(torch.uint8) if t.dtype == FP8_KV_DTYPE else t


def _layer_scale(c: CheckedPlan) -> torch.Tensor | None:
    """The scale of each layer in ``[layer_start, layer_stop)``, shaped to broadcast over ``[N, L, H, D]``."""
    if c.kv_scale is None:
        return None
    scale = c.kv_scale if c.kv_scale.numel() == 1 else c.kv_scale[c.layer_start : c.layer_stop]
    return scale.reshape(1, -1, 1, 1)


def _expand_rows(plan: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row index, token index within its row) for plan rows of ``counts`` tokens."""
    row = torch.repeat_interleave(torch.arange(plan.shape[0], device=plan.device), counts)
    starts = torch.cumsum(counts, 0) - counts
    return row, torch.arange(row.numel(), device=plan.device) - starts[row]


def run_copy_reference(pool: torch.Tensor, c: CheckedPlan, layout: PagedKVLayout, rotary_dim: int, style: str) -> None:
    row, i = _expand_rows(c.plan, c.plan[:, 4])
    p = c.plan[row]
    tokens = layout.token_view(_as_bytes(pool))  # [NB, T, NL, 2, H, D]
    kv = tokens[p[:, 0], p[:, 1] + i, c.layer_start : c.layer_stop]  # gathered copy: [N, L, 2, H, D]
    k = kv[:, :, 0].view(pool.dtype)
    kv[:, :, 0] = _as_bytes(rotate_reference(k, p[:, 5], c.inv_freq, rotary_dim, style, _layer_scale(c)))
    tokens[p[:, 2], p[:, 3] + i, c.layer_start : c.layer_stop] = kv


def run_inplace_reference(
    pool: torch.Tensor, c: CheckedPlan, layout: PagedKVLayout, rotary_dim: int, style: str
) -> None:
    row, i = _expand_rows(c.plan, c.plan[:, 2])
    p = c.plan[row]
    tokens = layout.token_view(_as_bytes(pool))
    index = (p[:, 0], p[:, 1] + i, slice(c.layer_start, c.layer_stop), 0)
    k = tokens[index].view(pool.dtype)
    tokens[index] = _as_bytes(rotate_reference(k, p[:, 3], c.inv_freq, rotary_dim, style, _layer_scale(c)))
