"""Plans: the rows a launch moves, built from token spans, checked, and packed into row groups.

A plan is an int64 tensor with one row per span piece; a row never leaves its block (`split_spans_to_plan` cuts token
spans at block boundaries; offsets may be unaligned):

- copy: ``(src_block, src_offset, dst_block, dst_offset, n_tokens, delta)``; K and V of tokens
  ``src_offset .. src_offset + n_tokens - 1`` of ``src_block`` go to the same slots of ``dst_block``.
- in place: ``(block, offset, n_tokens, delta)``; K of those tokens is rotated where it lies.

`check_plan` refuses plans that leave the pool or race (a slot written twice, or read and written by a copy) and
packs the rows with their row groups (consecutive rows with one target block and one delta) for one host-to-device
copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch

from ..layout import PagedKVLayout

RopeStyle = Literal["neox", "gptj"]
COPY_PLAN_COLUMNS = 6
INPLACE_PLAN_COLUMNS = 4
# Positions are exact fp32 integers below 2**24; larger deltas cannot be rotated exactly in fp32.
MAX_ABS_DELTA = (1 << 24) - 1
GROUP_COLUMNS = 8
"""A row group: first row, rows, target block, delta; then, for a one-row group, target offset, tokens, source block
and source offset minus target offset (zeros otherwise)."""


class InvalidPlan(ValueError):
    """A plan row points outside the pool, leaves its block, or would race with another row."""


@dataclass(frozen=True)
class CopySpan:
    """``n_tokens`` consecutive tokens from donor token index ``src_start`` to target token index ``dst_start``.

    Token indices count through the request's block list (token i lives in block ``i // T`` at offset ``i % T``).
    ``delta`` is the position shift applied to K; by default the token moves from position src_start to dst_start.
    """

    src_start: int
    dst_start: int
    n_tokens: int
    delta: int | None = None


@dataclass(frozen=True)
class InplaceSpan:
    """``n_tokens`` consecutive tokens from token index ``start`` whose K is rotated by ``delta`` in place."""

    start: int
    n_tokens: int
    delta: int


def split_spans_to_plan(
    spans: Iterable[CopySpan], src_block_ids: list[int], dst_block_ids: list[int], tokens_per_block: int
) -> torch.Tensor:
    """Copy-plan rows (int64 ``[S, 6]`` on CPU) for token spans over the donor's and the target's block lists.

    Called by the connector when it builds a materialization plan. Each span is cut wherever either side crosses a
    block boundary. Raises `InvalidPlan` for spans outside the block lists.
    """
    src_ids, dst_ids = np.asarray(src_block_ids, dtype=np.int64), np.asarray(dst_block_ids, dtype=np.int64)
    parts = []
    for span in spans:
        delta = span.dst_start - span.src_start if span.delta is None else span.delta
        _check_span(span.src_start, span.n_tokens, len(src_ids), tokens_per_block, "source")
        _check_span(span.dst_start, span.n_tokens, len(dst_ids), tokens_per_block, "target")
        starts = _cuts(span.n_tokens, tokens_per_block, span.src_start, span.dst_start)
        n = np.diff(np.append(starts, span.n_tokens))
        src, dst = span.src_start + starts, span.dst_start + starts
        block_src, block_dst = src_ids[src // tokens_per_block], dst_ids[dst // tokens_per_block]
        offsets_src, offsets_dst = src % tokens_per_block, dst % tokens_per_block
        deltas = np.full_like(n, delta)
        parts.append(np.stack([block_src, offsets_src, block_dst, offsets_dst, n, deltas], axis=1))
    return _rows(parts, COPY_PLAN_COLUMNS)


def split_inplace_spans_to_plan(
    spans: Iterable[InplaceSpan], block_ids: list[int], tokens_per_block: int
) -> torch.Tensor:
    """In-place plan rows (int64 ``[S, 4]`` on CPU) for token spans over one request's block list."""
    ids = np.asarray(block_ids, dtype=np.int64)
    parts = []
    for span in spans:
        _check_span(span.start, span.n_tokens, len(ids), tokens_per_block, "")
        starts = _cuts(span.n_tokens, tokens_per_block, span.start)
        n = np.diff(np.append(starts, span.n_tokens))
        pos = span.start + starts
        parts.append(
            np.stack([ids[pos // tokens_per_block], pos % tokens_per_block, n, np.full_like(n, span.delta)], 1)
        )
    return _rows(parts, INPLACE_PLAN_COLUMNS)


def _cuts(n_tokens: int, tokens_per_block: int, *starts: int) -> np.ndarray:
    """Span-relative indices where a row starts: 0 and every block boundary of any side inside the span."""
    firsts = [np.arange((-s) % tokens_per_block, n_tokens, tokens_per_block) for s in starts]
    return np.unique(np.concatenate([np.zeros(min(n_tokens, 1), dtype=np.int64), *firsts]))


def _rows(parts: list[np.ndarray], columns: int) -> torch.Tensor:
    if not parts:
        return torch.empty(0, columns, dtype=torch.int64)
    return torch.from_numpy(np.concatenate(parts).astype(np.int64).reshape(-1, columns))


def _check_span(start: int, n_tokens: int, num_blocks: int, tokens_per_block: int, side: str) -> None:
    if start < 0 or n_tokens < 0 or start + n_tokens > num_blocks * tokens_per_block:
        raise InvalidPlan(
            f"{side} span [{start}, {start + n_tokens}) is outside {num_blocks} blocks of {tokens_per_block} tokens"
        )


class CheckedPlan(NamedTuple):
    """A plan that passed `check_plan`, on the pool's device with its row groups."""

    plan: torch.Tensor  # int64, contiguous, on the pool's device
    groups: torch.Tensor  # int64 [G, GROUP_COLUMNS], on the pool's device: the row groups (`_row_groups`)
    inv_freq: torch.Tensor  # fp32, contiguous, on the pool's device
    kv_scale: torch.Tensor | None  # fp32 [num_layers] or [1], contiguous (fp8 pools only)
    layer_start: int
    layer_stop: int


def check_plan(
    pool: torch.Tensor,
    plan: torch.Tensor,
    inv_freq: torch.Tensor,
    layout: PagedKVLayout,
    rotary_dim: int,
    style: str,
    layers: tuple[int, int] | None,
    columns: int,
    kv_scale: torch.Tensor | None = None,
) -> CheckedPlan:
    """The launch's arguments and plan checked (`InvalidPlan`, ValueError, or the layout's own errors, before anything
    touches the pool), and the plan and its row groups on the pool's device in one host-to-device copy."""
    layout.check_pool(pool, kv_scale)
    if style not in ("neox", "gptj"):
        raise ValueError(f"style must be 'neox' or 'gptj', got {style!r}")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > layout.head_dim:
        raise ValueError(f"rotary_dim must be even and in (0, {layout.head_dim}], got {rotary_dim}")
    if inv_freq.dim() != 1 or inv_freq.numel() != rotary_dim // 2 or inv_freq.dtype != torch.float32:
        raise ValueError(f"inv_freq must be fp32 [{rotary_dim // 2}], got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    if not inv_freq.is_cuda and not bool(torch.isfinite(inv_freq).all()):  # no device sync on the serving path
        raise ValueError("inv_freq has non-finite values")
    start, stop = (0, layout.num_layers) if layers is None else layers
    if not 0 <= start < stop <= layout.num_layers:
        raise ValueError(f"layers must be [start, stop) within [0, {layout.num_layers}], got {layers}")
    if plan.dim() != 2 or plan.shape[1] != columns or plan.dtype != torch.int64:
        raise InvalidPlan(f"plan must be int64 [S, {columns}], got {plan.dtype} {tuple(plan.shape)}")
    rows = plan.cpu().numpy()
    _check_rows(rows, pool.shape[0], layout.tokens_per_block, columns)
    # One host-to-device copy carries the plan and its row groups.
    packed = torch.from_numpy(np.concatenate([rows.reshape(-1), _row_groups(rows, columns).reshape(-1)])).to(
        pool.device
    )
    return CheckedPlan(
        packed[: rows.size].view(-1, columns),
        packed[rows.size :].view(-1, GROUP_COLUMNS),
        inv_freq.to(pool.device).contiguous(),
        None if kv_scale is None else kv_scale.contiguous(),
        int(start),
        int(stop),
    )


def _row_groups(plan: np.ndarray, columns: int) -> np.ndarray:
    """Runs of consecutive rows with one target block and one delta, int64 ``[G, GROUP_COLUMNS]`` (see there).

    The kernels give each group one tile of ``tokens_per_block`` lanes (lane = target slot): rows that share a block
    (spans at odd offsets) fill one tile together instead of two half-empty ones. A one-row group (aligned spans) also
    carries its row's slots and source, so its program starts loading after one read of the group.
    """
    copy = columns == COPY_PLAN_COLUMNS
    target = plan[:, 2 if copy else 0]
    delta = plan[:, columns - 1]
    new_group = np.append(plan.shape[0] > 0, (target[1:] != target[:-1]) | (delta[1:] != delta[:-1]))
    first = np.flatnonzero(new_group)
    count = np.diff(np.append(first, plan.shape[0]))
    groups = np.zeros((first.size, GROUP_COLUMNS), dtype=np.int64)
    groups[:, 0], groups[:, 1], groups[:, 2], groups[:, 3] = first, count, target[first], delta[first]
    one = first[count == 1]
    dst_offset = plan[one, 3 if copy else 1]
    groups[count == 1, 4] = dst_offset
    groups[count == 1, 5] = plan[one, columns - 2]
    if copy:
        groups[count == 1, 6] = plan[one, 0]
        groups[count == 1, 7] = plan[one, 1] - dst_offset
    return groups


def _check_rows(plan: np.ndarray, num_blocks: int, tokens_per_block: int, columns: int) -> None:
    """Bounds, one block per row, and no races: no slot written twice, no slot both read and written (copy)."""
    if plan.shape[0] == 0:
        return
    copy = columns == COPY_PLAN_COLUMNS
    n = plan[:, columns - 2]
    sides = [plan[:, 0:2], plan[:, 2:4]] if copy else [plan[:, 0:2]]
    for side in sides:
        block, offset = side[:, 0], side[:, 1]
        if ((block < 0) | (block >= num_blocks)).any():
            raise InvalidPlan(f"plan names a block outside [0, {num_blocks})")
        if ((offset < 0) | (n < 1) | (offset + n > tokens_per_block)).any():
            raise InvalidPlan(f"every plan row must hold 1.. tokens inside one block of {tokens_per_block} tokens")
    if (np.abs(plan[:, columns - 1]) > MAX_ABS_DELTA).any():
        raise InvalidPlan(f"|delta| must be at most {MAX_ABS_DELTA}")
    # Rows as half-open intervals of token slots (block * T + offset).
    read_start = sides[0][:, 0] * tokens_per_block + sides[0][:, 1]
    write_start = sides[-1][:, 0] * tokens_per_block + sides[-1][:, 1]
    order = np.argsort(write_start, kind="stable")
    ws, we = write_start[order], (write_start + n)[order]
    if (ws[1:] < we[:-1]).any():
        raise InvalidPlan("two plan rows write the same token slot")
    if copy:
        order = np.argsort(read_start, kind="stable")
        rs, reach = read_start[order], np.maximum.accumulate((read_start + n)[order])
        last_read_before_end = np.searchsorted(rs, we, side="left") - 1
        hit = last_read_before_end >= 0
        if (reach[last_read_before_end[hit]] > ws[hit]).any():
            raise InvalidPlan("a plan row writes a slot that another row reads (copy source and target overlap)")
