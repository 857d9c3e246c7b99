"""RoPE-delta correction on paged KV: plans (`plan`), Triton kernels (`triton_kernels`), their launch settings
(`tuning`) and typed entry points (`launch`), and the torch reference, the oracle (`reference`).

K is cached after RoPE at the donor's positions. Rotary embeddings compose, ``R(p + d) k = R(d) R(p) k``, so K moves to
position ``p + d`` by one rotation of angle ``d * inv_freq``: computed in fp32 from the model's own inv_freq, with unit
cos/sin (any attention factor is already inside cached K). V is position-free and copied unchanged.

Plans are int64 tensors with one row per span; a row never leaves its block (`split_spans_to_plan` splits token spans at
block boundaries; offsets may be unaligned):

- copy: ``(src_block, src_offset, dst_block, dst_offset, n_tokens, delta)``; K and V of tokens
  ``src_offset .. src_offset + n_tokens - 1`` of ``src_block`` go to the same slots of ``dst_block``.
- in place: ``(block, offset, n_tokens, delta)``; K of those tokens is rotated where it lies.

One launch covers every plan row and every layer of ``layers`` (``[start, stop)``, default all). A row with delta 0 is a
pure copy (or nothing, in place).

fp8 (e4m3) pools pass ``kv_scale``, the cache's dequantization scale (``real = stored * scale``), fp32 ``[num_layers]``
or ``[1]``. Rotated K is rotated in fp32 and requantized (round to nearest even, saturating at +-448); the rotation is
linear, so the dequantization and requantization by the layer's scale cancel and the kernels skip them (the references,
the tests' oracle, apply them). V, delta-0 rows and channels past rotary_dim are copied byte for byte.

The Triton kernels run when the pool is on CUDA, or on any device when Triton's interpreter is on
(``TRITON_INTERPRET=1`` at import); otherwise the functions fall back to the torch reference.
"""

from .launch import rope_delta_copy, rope_delta_inplace, uses_triton
from .plan import (
    COPY_PLAN_COLUMNS,
    GROUP_COLUMNS,
    INPLACE_PLAN_COLUMNS,
    MAX_ABS_DELTA,
    CopySpan,
    InplaceSpan,
    InvalidPlan,
    RopeStyle,
    split_inplace_spans_to_plan,
    split_spans_to_plan,
)
from .reference import rope_delta_copy_reference, rope_delta_inplace_reference, rotate_reference
from .tuning import KernelTuning, default_tuning

__all__ = [
    "COPY_PLAN_COLUMNS",
    "GROUP_COLUMNS",
    "INPLACE_PLAN_COLUMNS",
    "MAX_ABS_DELTA",
    "CopySpan",
    "InplaceSpan",
    "InvalidPlan",
    "KernelTuning",
    "RopeStyle",
    "default_tuning",
    "rope_delta_copy",
    "rope_delta_copy_reference",
    "rope_delta_inplace",
    "rope_delta_inplace_reference",
    "rotate_reference",
    "split_inplace_spans_to_plan",
    "split_spans_to_plan",
    "uses_triton",
]
