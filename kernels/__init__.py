"""Triton kernels for semblend (installed as ``semblend_kernels``): RoPE-delta copy / in-place rotation on paged KV.

Depends on torch, and on triton for the kernels (without it every entry point runs its torch reference).
"""

from .layout import PagedKVLayout, UnsupportedKVDtype, UnsupportedLayout
from .rope import RopeConfig, UnsupportedRope
from .rope_delta import (
    CopySpan,
    InplaceSpan,
    InvalidPlan,
    KernelTuning,
    default_tuning,
    rope_delta_copy,
    rope_delta_copy_reference,
    rope_delta_inplace,
    rope_delta_inplace_reference,
    rotate_reference,
    split_inplace_spans_to_plan,
    split_spans_to_plan,
    uses_triton,
)

__all__ = [
    "CopySpan",
    "InplaceSpan",
    "InvalidPlan",
    "KernelTuning",
    "PagedKVLayout",
    "RopeConfig",
    "UnsupportedKVDtype",
    "UnsupportedLayout",
    "UnsupportedRope",
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
