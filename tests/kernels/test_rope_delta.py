"""The Triton RoPE-delta kernels against the torch reference, and the reference against first principles."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from semblend_kernels.layout import PagedKVLayout, UnsupportedKVDtype
from semblend_kernels.rope import RopeConfig
from semblend_kernels.rope_delta import (
    COPY_PLAN_COLUMNS,
    GROUP_COLUMNS,
    INPLACE_PLAN_COLUMNS,
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
from semblend_kernels.rope_delta.launch import _grid, _meta, _prefetch_step
from semblend_kernels.rope_delta.plan import _row_groups, check_plan
from semblend_kernels.rope_delta.triton_kernels import INTERPRETED
from semblend_kernels.rope_delta.tuning import _DEFAULT_TUNINGS

from tests.kernels.support import TRITON_DEVICES, assert_within_one_ulp

T = 8  # tokens per block in the small shapes
DONOR_BLOCKS = list(range(6))
TARGET_BLOCKS = [11, 7, 9, 6, 10, 8]  # a paged (non-monotonic) block table
# Spans that start at odd offsets, cross block boundaries on both sides, and carry deltas from 0 to +-100K.
COPY_SPANS = [
    CopySpan(src_start=3, dst_start=13, n_tokens=13),
    CopySpan(src_start=17, dst_start=1, n_tokens=5, delta=0),
    CopySpan(src_start=24, dst_start=30, n_tokens=11, delta=-100_000),
    CopySpan(src_start=40, dst_start=41, n_tokens=7, delta=99_999),
]
INPLACE_SPANS = [
    InplaceSpan(1, 14, 1),
    InplaceSpan(15, 9, -100_000),
    InplaceSpan(29, 3, 0),
    InplaceSpan(35, 12, 54_321),
]


def make_pool(layout: PagedKVLayout, num_blocks: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pool = torch.randn(num_blocks, layout.num_layers, 2, layout.block_elems, generator=g) * 3
    return pool.to(dtype).to(device)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("order", ["head_major", "token_major"])
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("rotary_dim", [32, 16], ids=["full", "partial"])
def test_kernels_match_reference(device: str, dtype: torch.dtype, order: str, style: str, rotary_dim: int) -> None:
    layout = PagedKVLayout(num_layers=3, num_kv_heads=3, head_dim=32, tokens_per_block=T, order=order)  # type: ignore[arg-type]
    pool = make_pool(layout, 12, dtype, device)
    assert uses_triton(pool)
    inv_freq = RopeConfig(head_dim=32, rotary_dim=rotary_dim, base=500_000.0, style=style).inv_freq(device)  # type: ignore[arg-type]
    kw = {"rotary_dim": rotary_dim, "style": style}

    copy_plan = split_spans_to_plan(COPY_SPANS, DONOR_BLOCKS, TARGET_BLOCKS, T)
    kernel, reference = pool.clone(), pool.clone()
    rope_delta_copy(kernel, copy_plan, inv_freq, layout, **kw)  # type: ignore[arg-type]
    rope_delta_copy_reference(reference, copy_plan, inv_freq, layout, **kw)  # type: ignore[arg-type]
    assert not torch.equal(reference, pool)
    assert_within_one_ulp(kernel, reference)

    inplace_plan = split_inplace_spans_to_plan(INPLACE_SPANS, TARGET_BLOCKS, T)
    kernel, reference = pool.clone(), pool.clone()
    rope_delta_inplace(kernel, inplace_plan, inv_freq, layout, **kw)  # type: ignore[arg-type]
    rope_delta_inplace_reference(reference, inplace_plan, inv_freq, layout, **kw)  # type: ignore[arg-type]
    assert not torch.equal(reference, pool)
    assert_within_one_ulp(kernel, reference)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_layer_subset_and_delta_zero_fast_path(device: str) -> None:
    layout = PagedKVLayout(num_layers=4, num_kv_heads=2, head_dim=16, tokens_per_block=T)
    pool = make_pool(layout, 12, torch.bfloat16, device, seed=1)
    inv_freq = RopeConfig(16, 16, 10_000.0).inv_freq(device)
    plan = split_spans_to_plan(
        [CopySpan(0, 0, 20, delta=0), CopySpan(20, 20, 12, delta=7)], DONOR_BLOCKS, TARGET_BLOCKS, T
    )
    out = pool.clone()
    rope_delta_copy(out, plan, inv_freq, layout, rotary_dim=16, layers=(1, 3))
    view, src = layout.view(out), layout.view(pool)
    for token in range(20):  # delta 0: K and V bit-identical to the donor's, in the copied layers only
        sb, db, off = DONOR_BLOCKS[token // T], TARGET_BLOCKS[token // T], token % T
        assert torch.equal(view[db, 1:3, :, :, off], src[sb, 1:3, :, :, off])
    untouched_layers = [0, 3]
    assert torch.equal(view[:, untouched_layers], src[:, untouched_layers])
    reference = pool.clone()
    rope_delta_copy_reference(reference, plan, inv_freq, layout, rotary_dim=16, layers=(1, 3))
    assert_within_one_ulp(out, reference)

    inplace = pool.clone()
    rope_delta_inplace(
        inplace, split_inplace_spans_to_plan([InplaceSpan(0, 48, 0)], TARGET_BLOCKS, T), inv_freq, layout, rotary_dim=16
    )
    assert torch.equal(inplace, pool)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_random_spans_match_reference(device: str, data: st.DataObject) -> None:
    """Random span sets (any offsets, any lengths, random deltas) over a random paged block table."""
    tokens_per_block = data.draw(st.sampled_from([4, 8, 16]))
    layout = PagedKVLayout(2, 2, 16, tokens_per_block, data.draw(st.sampled_from(["head_major", "token_major"])))
    n_blocks = 4
    capacity = n_blocks * tokens_per_block
    cuts = sorted(data.draw(st.sets(st.integers(1, capacity - 1), max_size=4)))
    bounds = [0, *cuts, capacity]
    spans = [
        CopySpan(a, a, b - a, delta=data.draw(st.integers(-100_000, 100_000)))
        for a, b in itertools.pairwise(bounds)
        if data.draw(st.booleans())
    ]
    order = data.draw(st.permutations(range(2 * n_blocks)))
    plan = split_spans_to_plan(spans, order[:n_blocks], order[n_blocks:], tokens_per_block)
    pool = make_pool(layout, 2 * n_blocks, torch.bfloat16, device, seed=data.draw(st.integers(0, 9)))
    style = data.draw(st.sampled_from(["neox", "gptj"]))
    tuning = KernelTuning(
        layers_per_program=data.draw(st.sampled_from([1, 2])),
        heads_per_program=data.draw(st.sampled_from([None, 1])),
        load_all_tiles=data.draw(st.booleans()),
        layers_fastest=data.draw(st.booleans()),
        one_trip_start=data.draw(st.booleans()),
    )
    inv_freq = RopeConfig(16, 16, 1e6).inv_freq(device)
    kernel, reference = pool.clone(), pool.clone()
    rope_delta_copy(kernel, plan, inv_freq, layout, rotary_dim=16, style=style, tuning=tuning)
    rope_delta_copy_reference(reference, plan, inv_freq, layout, rotary_dim=16, style=style)
    assert_within_one_ulp(kernel, reference)


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize(
    "tuning",
    [
        KernelTuning(4, 2),
        KernelTuning(2, 1),
        KernelTuning(8, 4, None),
        KernelTuning(8, 1, 64),
        KernelTuning(4, 2, None, heads_per_program=2),
        KernelTuning(4, 1, None, heads_per_program=3),
        KernelTuning(4, 2, 80, heads_per_program=3),
        KernelTuning(4, 1, None, load_all_tiles=True),
        KernelTuning(4, 2, None, heads_per_program=2, load_all_tiles=True),
        KernelTuning(8, 4, 64, heads_per_program=3, load_all_tiles=True),
        KernelTuning(4, 2, None, layers_fastest=True),
        KernelTuning(4, 2, None, 2, load_all_tiles=True, layers_fastest=True),
        KernelTuning(4, 2, None, one_trip_start=True),
        KernelTuning(8, 1, 64, heads_per_program=2, layers_fastest=True, one_trip_start=True),
        KernelTuning(4, 2, None, 2, load_all_tiles=True, one_trip_start=True),
        KernelTuning(4, 2, None, 2, one_trip_start=True, l2_prefetch=True),
    ],
)
def test_tunings_agree(device: str, tuning: KernelTuning) -> None:
    """5 heads and layers [1, 4): a program's last layer run and head run are partial, and row groups at odd offsets
    hold two rows or one, with deltas from 0 to +-100K. Load-all-tiles programs hold 5, 4 or 9 of their 8, 4 or 16
    tiles (layers x heads). One-trip-start programs (in place) step from a layer's last head to the next layer's first,
    over full and partial head runs, and meet two-row groups and delta 0 after reading the whole descriptor at once.
    The L2 prefetch (compiled only) covers 2 of 5 heads, the last run 1."""
    layout = PagedKVLayout(5, 5, 32, T)
    pool = make_pool(layout, 12, torch.bfloat16, device, seed=2)
    inv_freq = RopeConfig(32, 32, 1e4).inv_freq(device)
    plan = split_spans_to_plan(COPY_SPANS, DONOR_BLOCKS, TARGET_BLOCKS, T)
    kernel, reference = pool.clone(), pool.clone()
    rope_delta_copy(kernel, plan, inv_freq, layout, rotary_dim=32, layers=(1, 4), tuning=tuning)
    rope_delta_copy_reference(reference, plan, inv_freq, layout, rotary_dim=32, layers=(1, 4))
    assert_within_one_ulp(kernel, reference)
    inplace_plan = split_inplace_spans_to_plan(INPLACE_SPANS, TARGET_BLOCKS, T)
    rope_delta_inplace(kernel, inplace_plan, inv_freq, layout, rotary_dim=32, layers=(1, 4), tuning=tuning)
    rope_delta_inplace_reference(reference, inplace_plan, inv_freq, layout, rotary_dim=32, layers=(1, 4))
    assert_within_one_ulp(kernel, reference)


def test_layers_fastest_puts_layer_runs_on_the_first_grid_axis() -> None:
    layout = PagedKVLayout(5, 5, 32, T)
    pool = make_pool(layout, 12, torch.bfloat16, "cpu")
    inv_freq = RopeConfig(32, 32, 1e4).inv_freq()
    plan = split_inplace_spans_to_plan(INPLACE_SPANS, TARGET_BLOCKS, T)
    c = check_plan(pool, plan, inv_freq, layout, 32, "neox", (1, 4), INPLACE_PLAN_COLUMNS)
    groups = c.groups.shape[0]
    assert _grid(c, layout, KernelTuning(4, 2, None, 2, layers_fastest=True), 1) == (2, groups, 3)
    tiles = KernelTuning(4, 2, None, 2, load_all_tiles=True, layers_fastest=True)
    assert _grid(c, layout, tiles, 2) == (2, groups, 2 * 3)
    assert _meta(layout, 32, "neox", tiles, group_axis=1)["GROUP_AXIS"] == 1


def test_layers_fastest_keeps_row_groups_on_axis_0_past_the_second_axis_limit() -> None:
    """CUDA's second grid axis holds at most 65535 programs: beyond that, row groups stay on the first axis."""
    layout = PagedKVLayout(5, 5, 32, T)
    pool = make_pool(layout, 12, torch.bfloat16, "cpu")
    inv_freq = RopeConfig(32, 32, 1e4).inv_freq()
    plan = split_inplace_spans_to_plan(INPLACE_SPANS, TARGET_BLOCKS, T)
    c = check_plan(pool, plan, inv_freq, layout, 32, "neox", (1, 4), INPLACE_PLAN_COLUMNS)
    many = c._replace(groups=torch.zeros(65_536, GROUP_COLUMNS, dtype=torch.int64))
    assert _grid(many, layout, KernelTuning(4, 2, layers_fastest=True), 1) == (65_536, 2, 1)
    assert _grid(many._replace(groups=many.groups[:-1]), layout, KernelTuning(4, 2, layers_fastest=True), 1) == (
        2,
        65_535,
        1,
    )


def test_row_groups_pack_rows_of_one_target_block_and_delta() -> None:
    """Spans at odd offsets cut every target block into two rows; each pair (same block, same delta) is one group,
    and a new target block or a new delta starts the next group. A one-row group carries its row's slots and source."""
    plan = split_spans_to_plan(
        [CopySpan(3, 5, 30, delta=9), CopySpan(33, 35, 9, delta=-3)], DONOR_BLOCKS, TARGET_BLOCKS, T
    )
    rows = plan.numpy()
    groups = _row_groups(rows, COPY_PLAN_COLUMNS)
    assert groups.shape[1] == GROUP_COLUMNS and groups[:, 1].sum() == len(rows)
    for first, count, block, delta, *one_row in groups:
        group = rows[first : first + count]
        assert set(group[:, 2]) == {block} and set(group[:, 5]) == {delta}
        assert group[:, 4].sum() <= T
        if count == 1:
            src_block, src_offset, _, dst_offset, n, _ = group[0]
            assert one_row == [dst_offset, n, src_block, src_offset - dst_offset]
    for first in groups[1:, 0]:
        assert tuple(rows[first - 1, [2, 5]]) != tuple(rows[first, [2, 5]])
    assert (groups[:, 1] == 2).sum() >= 3 and (groups[:, 1] == 1).any()  # the odd offsets pair up
    assert _row_groups(rows[:0], COPY_PLAN_COLUMNS).shape == (0, GROUP_COLUMNS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("order", ["head_major", "token_major"])
@pytest.mark.parametrize(
    "tuning",
    [
        None,
        KernelTuning(4, 1, 64, 2),
        KernelTuning(4, 2, 80),
        KernelTuning(8, 1, None, load_all_tiles=True),
        KernelTuning(4, 2, None, 2, load_all_tiles=True),
        KernelTuning(16, 2, 40, layers_fastest=True),
        KernelTuning(4, 1, None, 4, load_all_tiles=True, layers_fastest=True),
        KernelTuning(16, 1, 40, layers_fastest=True, one_trip_start=True),
        KernelTuning(16, 2, 40, 3, layers_fastest=True, one_trip_start=True),
        KernelTuning(4, 1, None, 4, load_all_tiles=True, one_trip_start=True),
        KernelTuning(16, 1, 40, layers_fastest=True, one_trip_start=True, l2_prefetch=True),
        KernelTuning(16, 2, 40, 2, layers_fastest=True, one_trip_start=True, l2_prefetch=True),
    ],
    ids=[
        "default",
        "grid-two-heads",
        "grid-two-layers",
        "all-tiles-8",
        "all-tiles-2x2",
        "layers-fastest",
        "all-tiles-4-layers-fastest",
        "one-trip-start",
        "one-trip-start-3-heads-2-layers",
        "one-trip-start-all-tiles",
        "one-trip-prefetch",
        "one-trip-prefetch-2-heads-2-layers",
    ],
)
def test_llama_shape_on_gpu(order: str, tuning: KernelTuning | None) -> None:
    """A Llama-3-8B-shaped pool (32 layers, 8 KV heads, head dim 128, 32-token blocks) with unaligned spans."""
    if not uses_triton(torch.empty(0, device="cuda")):
        pytest.skip("Triton unavailable")
    layout = PagedKVLayout(32, 8, 128, 32, order)  # type: ignore[arg-type]
    pool = make_pool(layout, 64, torch.bfloat16, "cuda", seed=3)
    rope = RopeConfig.from_hf_config(LLAMA31_CONFIG)
    inv_freq = rope.inv_freq("cuda")
    plan = split_spans_to_plan(
        [CopySpan(5, 100, 900), CopySpan(905, 1000, 24, delta=0)], list(range(32)), list(range(32, 64)), 32
    )
    kernel, reference = pool.clone(), pool.clone()
    rope_delta_copy(kernel, plan, inv_freq, layout, rotary_dim=128, tuning=tuning)
    rope_delta_copy_reference(reference, plan, inv_freq, layout, rotary_dim=128)
    assert_within_one_ulp(kernel, reference)
    inplace_plan = split_inplace_spans_to_plan([InplaceSpan(3, 1000, -40_000)], list(range(32, 64)), 32)
    kernel = reference.clone()  # both start from the same state (the copy results may differ by one ulp)
    rope_delta_inplace(kernel, inplace_plan, inv_freq, layout, rotary_dim=128, tuning=tuning)
    rope_delta_inplace_reference(reference, inplace_plan, inv_freq, layout, rotary_dim=128)
    assert_within_one_ulp(kernel, reference)


LLAMA31_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}


# --- the reference itself, from first principles --------------------------------------------------------------------


def test_reference_rotation_composes_and_keeps_v_and_pass_through_dims() -> None:
    """R(a) R(b) = R(a + b); V and the channels past rotary_dim are copied bit for bit."""
    layout = PagedKVLayout(2, 2, 16, T)
    pool = make_pool(layout, 12, torch.float16, "cpu", seed=4)
    inv_freq = RopeConfig(16, 8, 1e4).inv_freq()
    a = pool.clone()
    rope_delta_copy_reference(
        a,
        split_spans_to_plan([CopySpan(0, 0, 16, delta=300)], DONOR_BLOCKS, TARGET_BLOCKS, T),
        inv_freq,
        layout,
        rotary_dim=8,
    )
    rope_delta_inplace_reference(
        a, split_inplace_spans_to_plan([InplaceSpan(0, 16, -1000)], TARGET_BLOCKS, T), inv_freq, layout, rotary_dim=8
    )
    b = pool.clone()
    rope_delta_copy_reference(
        b,
        split_spans_to_plan([CopySpan(0, 0, 16, delta=-700)], DONOR_BLOCKS, TARGET_BLOCKS, T),
        inv_freq,
        layout,
        rotary_dim=8,
    )
    va, vb = layout.view(a), layout.view(b)
    torch.testing.assert_close(
        va[TARGET_BLOCKS[:2], :, 0].float(), vb[TARGET_BLOCKS[:2], :, 0].float(), atol=3e-3, rtol=3e-3
    )
    src = layout.view(pool)
    assert torch.equal(vb[TARGET_BLOCKS[:2], :, 1], src[DONOR_BLOCKS[:2], :, 1])
    assert torch.equal(vb[TARGET_BLOCKS[:2], :, 0, :, :, 8:], src[DONOR_BLOCKS[:2], :, 0, :, :, 8:])


def test_rotate_reference_against_complex_multiplication() -> None:
    """NeoX pairs (i, i + r/2) and GPT-J pairs (2i, 2i+1) are complex numbers multiplied by exp(i * delta * w)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 2, 8, generator=g, dtype=torch.float64).float()
    delta = torch.tensor([0, 5, -12345])
    inv_freq = RopeConfig(8, 8, 1e4).inv_freq()
    theta = (delta[:, None, None].float() * inv_freq).double()  # the contract: the angle is rounded to fp32
    phase = torch.polar(torch.ones(3, 1, 4, dtype=torch.float64), theta)
    neox = torch.view_as_real(torch.complex(x[..., :4].double(), x[..., 4:].double()) * phase)
    expected_neox = torch.cat([neox[..., 0], neox[..., 1]], dim=-1)
    torch.testing.assert_close(
        rotate_reference(x, delta, inv_freq, 8, "neox").double(), expected_neox, atol=1e-6, rtol=1e-6
    )
    gptj = torch.view_as_real(torch.view_as_complex(x.double().reshape(3, 2, 4, 2).contiguous()) * phase).reshape(
        3, 2, 8
    )
    torch.testing.assert_close(rotate_reference(x, delta, inv_freq, 8, "gptj").double(), gptj, atol=1e-6, rtol=1e-6)


# --- plans and refusals ---------------------------------------------------------------------------------------------


def test_split_spans_cuts_at_both_sides_block_boundaries() -> None:
    plan = split_spans_to_plan([CopySpan(src_start=6, dst_start=3, n_tokens=12)], [10, 11, 12], [20, 21, 22], 8)
    assert plan.tolist() == [
        [10, 6, 20, 3, 2, -3],
        [11, 0, 20, 5, 3, -3],
        [11, 3, 21, 0, 5, -3],
        [12, 0, 21, 5, 2, -3],
    ]
    assert int(plan[:, 4].sum()) == 12
    inplace = split_inplace_spans_to_plan([InplaceSpan(7, 10, 4)], [3, 1, 2], 8)
    assert inplace.tolist() == [[3, 7, 1, 4], [1, 0, 8, 4], [2, 0, 1, 4]]
    with pytest.raises(InvalidPlan):
        split_spans_to_plan([CopySpan(20, 0, 8)], [1, 2, 3], [4, 5, 6], 8)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([0, 6, 7, 0, 3, 1], "inside one block"),
        ([0, 0, 12, 0, 3, 1], "outside"),
        ([0, 0, 7, 0, 0, 1], "inside one block"),
        ([0, 0, 7, 0, 2, 1 << 25], "delta"),
        ([0, 0, 0, 2, 4, 1], "overlap"),
    ],
)
def test_bad_copy_plans_are_refused_before_touching_the_pool(row: list[int], message: str) -> None:
    layout = PagedKVLayout(1, 1, 8, T)
    pool = make_pool(layout, 12, torch.bfloat16, "cpu")
    before = pool.clone()
    with pytest.raises(InvalidPlan, match=message):
        rope_delta_copy(pool, torch.tensor([row]), RopeConfig(8, 8, 1e4).inv_freq(), layout, rotary_dim=8)
    assert torch.equal(pool, before)


def test_rows_writing_one_slot_twice_are_refused() -> None:
    layout = PagedKVLayout(1, 1, 8, T)
    pool = make_pool(layout, 12, torch.bfloat16, "cpu")
    plan = torch.tensor([[0, 0, 5, 0, 4, 1], [1, 0, 5, 2, 4, 1]])
    with pytest.raises(InvalidPlan, match="same token slot"):
        rope_delta_copy(pool, plan, RopeConfig(8, 8, 1e4).inv_freq(), layout, rotary_dim=8)
    with pytest.raises(InvalidPlan, match="same token slot"):
        rope_delta_inplace(
            pool, torch.tensor([[3, 0, 4, 1], [3, 3, 2, 1]]), RopeConfig(8, 8, 1e4).inv_freq(), layout, rotary_dim=8
        )


def test_fp8_pool_without_scale_is_declined() -> None:
    layout = PagedKVLayout(1, 1, 8, T)
    pool = torch.zeros(4, 1, 2, layout.block_elems, dtype=torch.float8_e4m3fn)
    with pytest.raises(UnsupportedKVDtype, match=r"float8_e4m3fn\) pool needs its dequantization scale"):
        rope_delta_copy(
            pool, torch.tensor([[0, 0, 1, 0, 1, 1]]), RopeConfig(8, 8, 1e4).inv_freq(), layout, rotary_dim=8
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rotary_dim": 6}, "inv_freq"),
        ({"rotary_dim": 7}, "even"),
        ({"rotary_dim": 8, "style": "glm"}, "style"),
        ({"rotary_dim": 8, "layers": (1, 1)}, "layers"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], message: str) -> None:
    layout = PagedKVLayout(1, 1, 8, T)
    pool = make_pool(layout, 4, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match=message):
        rope_delta_inplace(pool, torch.tensor([[0, 0, 1, 1]]), RopeConfig(8, 8, 1e4).inv_freq(), layout, **kwargs)  # type: ignore[arg-type]


def test_empty_plan_is_a_no_op() -> None:
    layout = PagedKVLayout(1, 1, 8, T)
    pool = make_pool(layout, 4, torch.bfloat16, "cpu")
    before = pool.clone()
    rope_delta_copy(pool, split_spans_to_plan([], [0], [1], T), RopeConfig(8, 8, 1e4).inv_freq(), layout, rotary_dim=8)
    assert torch.equal(pool, before)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(*[st.integers(0, 3), st.integers(0, 7)] * 2, st.integers(1, 8)), min_size=1, max_size=5))
def test_race_check_agrees_with_slot_sets(rows: list[tuple[int, int, int, int, int]]) -> None:
    """The interval-based race check refuses exactly the plans whose token-slot sets collide."""
    layout = PagedKVLayout(1, 1, 8, T)
    pool = make_pool(layout, 4, torch.bfloat16, "cpu")
    plan = torch.tensor([[*row, 0] for row in rows])
    in_block = all(so + n <= T and do + n <= T for _, so, _, do, n in rows)
    reads = [(sb, so + i) for sb, so, _, _, n in rows for i in range(n)]
    writes = [(db, do + i) for _, _, db, do, n in rows for i in range(n)]
    racy = len(set(writes)) < len(writes) or bool(set(writes) & set(reads))
    if in_block and not racy:
        rope_delta_copy_reference(pool, plan, RopeConfig(8, 8, 1e4).inv_freq(), layout, rotary_dim=8)
    else:
        with pytest.raises(InvalidPlan):
            rope_delta_copy_reference(pool, plan, RopeConfig(8, 8, 1e4).inv_freq(), layout, rotary_dim=8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("op", ["copy", "inplace"])
def test_default_tuning_covers_every_dtype_op_and_size(dtype: torch.dtype, op: str) -> None:
    for head_blocks in (1, 1 << 14, (1 << 14) + 1, 1 << 40):
        assert isinstance(default_tuning(dtype, op, head_blocks), KernelTuning)  # type: ignore[arg-type]


FP8_INPLACE_2K = KernelTuning(
    num_warps=4, layers_per_program=1, max_registers=None, heads_per_program=4, load_all_tiles=True, one_trip_start=True
)
"""fp8 in place at 2K (and fp8 copy at Qwen2.5-7B 2K): load-all-tiles programs with the one-trip start, the
session-12 H200 short sweep's best at both models."""
BF16_INPLACE_ONE_TRIP = KernelTuning(
    num_warps=16, layers_per_program=1, max_registers=40, layers_fastest=True, one_trip_start=True
)
"""bf16 in place at Llama-3-8B 2K / 8K / 32K: layers-fastest order with the one-trip start, the session-12 H200 short
sweep's best at Llama-3-8B 2K, and session 13's at Llama-3-8B 8K and 32K."""
BF16_INPLACE_TWO_HEADS_PREFETCH = replace(BF16_INPLACE_ONE_TRIP, heads_per_program=2, l2_prefetch=True)
"""bf16 in place at Qwen2.5-7B 2K (and, at 8 warps, 8K): two heads a program with the L2 prefetch, session 14's H200
best at both (1.4-2.3 points ahead of the one-trip setting)."""


@pytest.mark.parametrize(
    ("dtype", "op", "head_blocks", "expected"),
    [
        # 32K tokens in place: the H200 per-size sweep's best (the old table gave 2K-8K settings here)
        (torch.bfloat16, "inplace", 262_144, BF16_INPLACE_ONE_TRIP),
        (torch.bfloat16, "inplace", 114_688, KernelTuning(16, 8, 40)),
        (torch.float8_e4m3fn, "inplace", 262_144, KernelTuning(4, 2, 64)),
        (torch.float8_e4m3fn, "inplace", 114_688, KernelTuning(4, 2, 64)),
        # 2K tokens: Qwen2.5-7B (7168 head-blocks) and Llama-3-8B (16384), and the odd-offset Llama 2K (65 groups)
        (torch.float8_e4m3fn, "inplace", 7_168, FP8_INPLACE_2K),
        (torch.float8_e4m3fn, "inplace", 16_384, FP8_INPLACE_2K),
        (torch.float8_e4m3fn, "inplace", 16_640, FP8_INPLACE_2K),
        (torch.float8_e4m3fn, "copy", 7_168, FP8_INPLACE_2K),
        (torch.bfloat16, "inplace", 7_168, BF16_INPLACE_TWO_HEADS_PREFETCH),
        (torch.bfloat16, "inplace", 16_384, BF16_INPLACE_ONE_TRIP),
        (torch.bfloat16, "inplace", 16_640, BF16_INPLACE_ONE_TRIP),
        (torch.bfloat16, "inplace", 28_672, replace(BF16_INPLACE_TWO_HEADS_PREFETCH, num_warps=8)),
        (torch.bfloat16, "inplace", 65_536, BF16_INPLACE_ONE_TRIP),
        (torch.bfloat16, "copy", 16_384, KernelTuning(16, 4, 32)),
        (torch.bfloat16, "copy", 65_536, KernelTuning(8, 4, 64)),
    ],
)
def test_default_tuning_is_the_sweeps_best_at_each_benchmarked_size(
    dtype: torch.dtype, op: str, head_blocks: int, expected: KernelTuning
) -> None:
    assert default_tuning(dtype, op, head_blocks) == expected  # type: ignore[arg-type]


def test_default_table_bounds_rise_and_end_open() -> None:
    bounds: dict[tuple[bool, str], list[int]] = {}
    for fp8, op, most, _ in _DEFAULT_TUNINGS:
        bounds.setdefault((fp8, op), []).append(most)
    assert set(bounds) == {(f, o) for f in (False, True) for o in ("copy", "inplace")}
    for most in bounds.values():
        assert most == sorted(set(most)) and most[-1] == 1 << 62


def test_load_all_tiles_programs_take_one_group_and_a_fixed_tile_count() -> None:
    """One program per (group, layer run, head run), as the grid kernel with one group per program; the tile tensor
    is sized by the tuning and the layout (every layer run and head run fits), not by the call's layer range."""
    layout = PagedKVLayout(5, 5, 32, T)
    pool = make_pool(layout, 12, torch.bfloat16, "cpu")
    inv_freq = RopeConfig(32, 32, 1e4).inv_freq()
    plan = split_inplace_spans_to_plan(INPLACE_SPANS, TARGET_BLOCKS, T)
    c = check_plan(pool, plan, inv_freq, layout, 32, "neox", (1, 4), INPLACE_PLAN_COLUMNS)
    tiles = KernelTuning(4, 2, None, 2, load_all_tiles=True)
    assert _grid(c, layout, tiles, 2) == (c.groups.shape[0], 2, 2 * 3)
    assert _meta(layout, 32, "neox", tiles)["TILES"] == 4
    assert _meta(layout, 32, "neox", KernelTuning(4, 8, None, load_all_tiles=True))["TILES"] == 32  # 5 x 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_warps": 0}, "must be positive"),
        ({"layers_per_program": 0}, "must be positive"),
        ({"heads_per_program": 0}, "must be positive"),
        ({"max_registers": -1}, "must be positive"),
        ({"l2_prefetch": True}, "a step of the one-trip in-place grid program"),
        (
            {"l2_prefetch": True, "one_trip_start": True, "load_all_tiles": True},
            "a step of the one-trip in-place grid program",
        ),
    ],
)
def test_bad_tunings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KernelTuning(**kwargs)  # type: ignore[arg-type]


def test_l2_prefetch_applies_only_to_compiled_head_major_pools() -> None:
    """`KernelTuning.l2_prefetch`'s kernel argument: the element size where the pool allows the bulk prefetch (head-major,
    compiled, on sm_90 or later); otherwise none, and the kernel compiles as without it."""
    prefetch = KernelTuning(16, 1, 40, 2, layers_fastest=True, one_trip_start=True, l2_prefetch=True)
    qwen = PagedKVLayout(2, 4, 128, 32)
    device = "cpu" if INTERPRETED else "cuda"
    pool = torch.zeros(3, 2, 2, qwen.block_elems, dtype=torch.bfloat16, device=device)
    sm90 = not INTERPRETED and torch.cuda.get_device_capability() >= (9, 0)
    compiled = {"PREFETCH_ELEM_BYTES": 2} if sm90 else {}
    assert _prefetch_step(pool, qwen, prefetch) == compiled
    assert _prefetch_step(pool, qwen, replace(prefetch, l2_prefetch=False)) == {}
    assert _prefetch_step(pool, PagedKVLayout(2, 4, 128, 32, "token_major"), prefetch) == {}
    assert _prefetch_step(pool.cpu(), qwen, prefetch) == {}
