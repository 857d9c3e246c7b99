"""Every KV storage dtype (fp16, bf16, fp32, fp8 e4m3 with a per-layer scale) against an fp32 reference rotation.

The bound is the issue's: the kernel's output, dequantized, is within one storage step (one ulp; for fp8 one e4m3
step times the layer's scale) of the source K rotated in fp32. V, delta-0 rows and channels past rotary_dim must come
through byte for byte.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from semblend_kernels.layout import PagedKVLayout, UnsupportedKVDtype
from semblend_kernels.rope import RopeConfig
from semblend_kernels.rope_delta import (
    CopySpan,
    InplaceSpan,
    KernelTuning,
    rope_delta_copy,
    rope_delta_copy_reference,
    rope_delta_inplace,
    rope_delta_inplace_reference,
    rotate_reference,
    split_inplace_spans_to_plan,
    split_spans_to_plan,
    triton_kernels,
)

from tests.kernels.support import TRITON_DEVICES

FP8 = torch.float8_e4m3fn
T = 4
DONOR, TARGET = [0, 1, 2, 3], [7, 5, 4, 6]
COPY_SPANS = [
    CopySpan(1, 2, 5, delta=-77_777),
    CopySpan(6, 8, 2, delta=0),
    CopySpan(9, 12, 4, delta=31_415),
]
INPLACE_SPANS = [InplaceSpan(1, 5, 2_024), InplaceSpan(6, 3, 0), InplaceSpan(10, 6, -5)]
LAYER_SCALES = [0.0173, 0.61]
ONE_LAYER = KernelTuning(4, 1, 64)
"""Grid programs of one layer each, under a register cap."""
ALL_TILES = KernelTuning(4, 2, None, load_all_tiles=True)
"""Each program loads both layers' tiles of its row group (K or V) at once (copy: with K's channels past rotary_dim)."""
LAYERS_FASTEST = KernelTuning(4, 2, layers_fastest=True)
"""Layer runs on the first grid axis, row groups on the second."""
ONE_TRIP = KernelTuning(4, 2, None, one_trip_start=True)
"""In place: one row group per program, its descriptor read at once, its first tile loaded before cos/sin."""
ONE_TRIP_TILES = KernelTuning(4, 2, None, load_all_tiles=True, one_trip_start=True)
"""Load-all-tiles programs whose one-row groups' slots are read with the rest of the descriptor (copy and in place)."""
ONE_TRIP_PREFETCH = KernelTuning(4, 2, None, one_trip_start=True, l2_prefetch=True)
"""In place: the one-trip program after an L2 bulk prefetch of its heads (compiled only; the interpreter ignores it)."""


def make_pool(layout: PagedKVLayout, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A pool whose values span many binades (fp8: subnormals too, |q| <= 300 so rotation never saturates)."""
    g = torch.Generator().manual_seed(7)
    shape = (8, layout.num_layers, 2, layout.block_elems)
    values = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-9, 6, shape, generator=g).float())
    if dtype != FP8:
        return values.to(dtype).to(device), None
    return values.clamp(-300, 300).to(FP8).to(device), torch.tensor(LAYER_SCALES, device=device)


def dequantized(pool: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    x = pool.to(torch.float32, copy=True)
    return x if scale is None else x * scale.reshape(1, -1, 1, 1)


def step(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype``'s values at |x| (in storage units): eps * 2**floor(log2|x|), subnormal spacing below."""
    info = torch.finfo(dtype)
    binade = torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(info.smallest_normal))))
    return info.eps * binade


def assert_within_one_step(
    out: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor | None, layout: PagedKVLayout
) -> None:
    """``out`` (the pool after the kernel) vs ``expected`` (fp32 values): one storage step at either magnitude, plus
    the fp32 arithmetic of the rotation itself (4 fp32 ulps of the largest value of the same head row: it matters for
    fp32 storage, and where a rotated pair nearly cancels)."""
    s = torch.ones(1, 1, 1, 1, device=out.device) if scale is None else scale.reshape(1, -1, 1, 1)
    actual = dequantized(out, scale)
    tol = step(torch.maximum(actual.abs(), expected.abs()) / s, out.dtype) * s
    row_max = layout.view(expected).abs().amax(dim=-1, keepdim=True).expand(layout.view(expected).shape)
    tol = tol + 4 * torch.finfo(torch.float32).eps * row_max.reshape(expected.shape)
    excess = ((actual - expected).abs() - tol).max().item()
    assert excess <= 0, f"more than one {out.dtype} step from the fp32 reference (excess {excess:.3g})"


def fp32_oracle(
    pool: torch.Tensor, scale: torch.Tensor | None, op: str, layout: PagedKVLayout, **kw: object
) -> torch.Tensor:
    """The same plan applied to the dequantized pool in fp32 (no rounding back to the storage dtype)."""
    exact = dequantized(pool, scale)
    if op == "copy":
        plan = split_spans_to_plan(COPY_SPANS, DONOR, TARGET, T)
        rope_delta_copy_reference(exact, plan, **kw, layout=layout)  # type: ignore[arg-type]
    else:
        plan = split_inplace_spans_to_plan(INPLACE_SPANS, TARGET, T)
        rope_delta_inplace_reference(exact, plan, **kw, layout=layout)  # type: ignore[arg-type]
    return exact


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, FP8], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize(
    "tuning",
    [None, ONE_LAYER, ALL_TILES, LAYERS_FASTEST, ONE_TRIP, ONE_TRIP_TILES, ONE_TRIP_PREFETCH],
    ids=[
        "default",
        "one-layer",
        "all-tiles",
        "layers-fastest",
        "one-trip",
        "one-trip-all-tiles",
        "one-trip-prefetch",
    ],
)
def test_every_dtype_within_one_step_of_fp32(
    device: str, dtype: torch.dtype, head_dim: int, style: str, partial: bool, tuning: KernelTuning | None
) -> None:
    rotary_dim = head_dim // 2 if partial else head_dim
    layout = PagedKVLayout(num_layers=2, num_kv_heads=1, head_dim=head_dim, tokens_per_block=T)
    pool, scale = make_pool(layout, dtype, device)
    inv_freq = RopeConfig(head_dim, rotary_dim, 1e6, style).inv_freq(device)  # type: ignore[arg-type]
    kw = {"inv_freq": inv_freq, "rotary_dim": rotary_dim, "style": style}
    for op, kernel_fn, reference_fn, plan in [
        ("copy", rope_delta_copy, rope_delta_copy_reference, split_spans_to_plan(COPY_SPANS, DONOR, TARGET, T)),
        (
            "inplace",
            rope_delta_inplace,
            rope_delta_inplace_reference,
            split_inplace_spans_to_plan(INPLACE_SPANS, TARGET, T),
        ),
    ]:
        kernel, reference = pool.clone(), pool.clone()
        kernel_fn(kernel, plan, layout=layout, kv_scale=scale, tuning=tuning, **kw)  # type: ignore[operator]
        reference_fn(reference, plan, layout=layout, kv_scale=scale, **kw)  # type: ignore[operator]
        expected = fp32_oracle(pool, scale, op, layout, **kw)
        assert not torch.equal(dequantized(pool, scale), expected)
        assert_within_one_step(kernel, expected, scale, layout)
        assert_within_one_step(reference, expected, scale, layout)
        # Bytes that no rotation touches: V, K past rotary_dim, and rows with delta 0 (copied or left alone).
        untouched = layout.view(kernel.view(torch.uint8) if dtype == FP8 else kernel)
        oracle = layout.view(reference.view(torch.uint8) if dtype == FP8 else reference)
        assert torch.equal(untouched[:, :, 1], oracle[:, :, 1])
        assert torch.equal(untouched[..., rotary_dim:], oracle[..., rotary_dim:])


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_fp8_one_scale_for_the_pool_and_byte_exact_delta_zero(device: str) -> None:
    """A [1] scale (per tensor) works, and delta-0 copy moves arbitrary bytes (NaN codes too) unchanged."""
    layout = PagedKVLayout(num_layers=2, num_kv_heads=2, head_dim=64, tokens_per_block=T, order="token_major")
    g = torch.Generator().manual_seed(3)
    raw = torch.randint(0, 256, (8, 2, 2, layout.block_elems), generator=g, dtype=torch.uint8)
    pool = raw.view(FP8).to(device)
    scale = torch.tensor([0.25], device=device)
    inv_freq = RopeConfig(64, 64, 1e4).inv_freq(device)
    out = pool.clone()
    plan = split_spans_to_plan([CopySpan(0, 0, 16, delta=0)], DONOR, TARGET, T)
    rope_delta_copy(out, plan, inv_freq, layout, rotary_dim=64, kv_scale=scale)
    src, dst = layout.view(pool.view(torch.uint8)), layout.view(out.view(torch.uint8))
    assert torch.equal(dst[TARGET], src[DONOR])

    finite = (torch.randn(8, 2, 2, layout.block_elems, generator=g) * 50).to(FP8).to(device)
    kernel, reference = finite.clone(), finite.clone()
    inplace = split_inplace_spans_to_plan(INPLACE_SPANS, TARGET, T)
    rope_delta_inplace(kernel, inplace, inv_freq, layout, rotary_dim=64, kv_scale=scale)
    rope_delta_inplace_reference(reference, inplace, inv_freq, layout, rotary_dim=64, kv_scale=scale)
    assert not torch.equal(kernel.view(torch.uint8), finite.view(torch.uint8))
    assert_within_one_step(kernel, dequantized(reference, scale), scale, layout)


@triton.jit
def _round_to_fp8_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, triton_kernels._to_storage(tl.load(x_ptr + i), tl.float8e4nv, True))


@pytest.mark.skipif(not triton_kernels.INTERPRETED, reason="the hand rounding runs under Triton's interpreter only")
def test_interpreter_fp8_rounding_is_torchs_nearest_even_saturating_cast() -> None:
    """Every e4m3 code, the midpoints between neighbours (ties), one fp32 ulp either side, and out-of-range values."""
    codes = torch.arange(0, 127, dtype=torch.uint8).view(FP8).float()  # +0 .. 448
    mids = (codes[:-1] + codes[1:]) / 2
    near = torch.cat([mids, torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1), codes])
    x = torch.cat([near, -near, torch.tensor([449.0, 463.9, 464.0, 1e6, -1e6, 1e-12, -1e-12])])
    n = triton.next_power_of_2(x.numel())
    padded = torch.zeros(n)
    padded[: x.numel()] = x
    out = torch.empty(n, dtype=FP8)
    _round_to_fp8_kernel[(1,)](padded, out, N=n)
    expected = x.clamp(-448, 448).to(FP8)
    assert torch.equal(out[: x.numel()].view(torch.uint8), expected.view(torch.uint8))


def test_rotate_reference_fp8_keeps_pass_through_bytes_and_scales() -> None:
    """Dequantize -> rotate -> requantize: a 90-degree turn of (q1, q2) is (-q2, q1) whatever the scale."""
    x = torch.tensor([[[2.0, 3.0, -7.0, 0.5]]]).to(FP8)  # [N=1, 1, D=4], rotary_dim 2 (GPT-J pair 0, 1)
    inv_freq = torch.tensor([torch.pi / 2 / 1000], dtype=torch.float32)
    out = rotate_reference(x, torch.tensor([1000]), inv_freq, 2, "gptj", scale=torch.tensor(0.37))
    assert out.dtype == FP8
    assert out.float()[0, 0].tolist() == [-3.0, 2.0, -7.0, 0.5]


@pytest.mark.parametrize(
    ("dtype", "scale", "message"),
    [
        (FP8, None, "needs its dequantization scale"),
        (FP8, torch.tensor([1.0, 2.0, 3.0]), r"fp32 \[2\] or \[1\]"),
        (FP8, torch.tensor([1.0, 2.0], dtype=torch.float64), "fp32"),
        (FP8, torch.tensor([1.0, 0.0]), "finite and positive"),
        (FP8, torch.tensor([1.0, float("nan")]), "finite and positive"),
        (torch.bfloat16, torch.tensor([1.0]), "float8_e4m3fn pools only"),
        (torch.float8_e5m2, torch.tensor([1.0]), "not supported"),
    ],
)
def test_bad_kv_dtype_or_scale_is_refused(dtype: torch.dtype, scale: torch.Tensor | None, message: str) -> None:
    layout = PagedKVLayout(2, 1, 8, T)
    pool = torch.zeros(4, 2, 2, layout.block_elems).to(dtype)
    inv_freq = RopeConfig(8, 8, 1e4).inv_freq()
    for fn in (rope_delta_copy, rope_delta_copy_reference):
        with pytest.raises(UnsupportedKVDtype, match=message):
            fn(pool, torch.tensor([[0, 0, 1, 0, 1, 1]]), inv_freq, layout, rotary_dim=8, kv_scale=scale)
    with pytest.raises(UnsupportedKVDtype, match=message):
        rope_delta_inplace(pool, torch.tensor([[0, 0, 1, 1]]), inv_freq, layout, rotary_dim=8, kv_scale=scale)
