"""The Triton kernels: one program per row group (and run of layers and heads), rotating K by the group's delta in
fp32 (unit cos/sin from the model's inv_freq) and copying V; `launch` picks one and sizes its grid.

``INTERPRETED``: whether Triton's interpreter runs them (``TRITON_INTERPRET=1`` at import).
"""

from __future__ import annotations

from .plan import GROUP_COLUMNS

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch reference still works
    triton = None  # type: ignore[assignment]

if triton is not None:
    _GROUP_COLS = tl.constexpr(GROUP_COLUMNS)
    _INV_TWO_PI = tl.constexpr(0.15915494309189535)
    # 2*pi split so that k * _TWO_PI_HI and k * _TWO_PI_MID are exact for |k| < 2**15 (|angle| up to ~2e5 rad).
    _TWO_PI_HI = tl.constexpr(6.28125)
    _TWO_PI_MID = tl.constexpr(0.001934051513671875)
    _TWO_PI_LO = tl.constexpr(1.2556658930407139e-06)
    _TWO_OVER_PI = tl.constexpr(0.6366197723675814)
    # pi/2 split the same way (the quotient is at most 2 in magnitude here, so every product is exact).
    _HALF_PI_HI = tl.constexpr(1.5703125)
    _HALF_PI_MID = tl.constexpr(4.837512969970703125e-4)
    _HALF_PI_LO = tl.constexpr(7.54978995489188216e-8)

    @triton.jit
    def _unit_cos_sin(inv_freq_ptr, delta, ROTARY_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr):
        """cos/sin of delta * inv_freq in fp32 (every token of a row group shares the delta).

        Explicit range reductions, to [-pi, pi] and then to [-pi/4, pi/4] and a quadrant, and short polynomials
        (within 2 fp32 ulps): a library sin/cos also carries a slow path for huge arguments that costs registers.
        """
        j = tl.arange(0, BLOCK_HALF)
        inv = tl.load(inv_freq_ptr + j, mask=j < ROTARY_DIM // 2, other=0.0)
        theta = delta.to(tl.float32) * inv
        k = tl.floor(theta * _INV_TWO_PI + 0.5)
        r = theta - k * _TWO_PI_HI
        r = r - k * _TWO_PI_MID
        r = r - k * _TWO_PI_LO
        q = tl.floor(r * _TWO_OVER_PI + 0.5)  # -2 .. 2
        y = r - q * _HALF_PI_HI
        y = y - q * _HALF_PI_MID
        y = y - q * _HALF_PI_LO
        z = y * y
        sin_y = y + y * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4))
        cos_y = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5))
        quadrant = q.to(tl.int32) & 3
        swap = (quadrant & 1) != 0
        sin = tl.where(swap, cos_y, sin_y)
        cos = tl.where(swap, sin_y, cos_y)
        return tl.where(((quadrant + 1) & 2) != 0, -cos, cos), tl.where((quadrant & 2) != 0, -sin, sin)

    @triton.jit
    def _to_storage(x, DTYPE: tl.constexpr, INTERPRETED: tl.constexpr):
        """Round fp32 to the KV dtype, to nearest even (fp8: saturating at +-448, as TensorRT-LLM quantizes).

        On the GPU this is the hardware conversion (cvt.rn; fp8: cvt.rn.satfinite). Triton's interpreter truncates
        fp32 -> bf16 casts, and its fp32 -> fp8 cast rounds halves up and mangles subnormals and large values, so
        under the interpreter both are rounded by hand, and the CPU tests see the GPU's rounding.
        """
        if INTERPRETED and tl.bfloat16 == DTYPE:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        elif INTERPRETED and tl.float8e4nv == DTYPE:
            return _fp8_e4m3_rne(tl.minimum(tl.maximum(x, -448.0), 448.0))
        else:
            return x.to(DTYPE)

    @triton.jit
    def _fp8_e4m3_rne(x):
        """fp32 in [-448, 448] -> e4m3fn, round to nearest even, with integer and exact fp32 ops only."""
        bits = x.to(tl.uint32, bitcast=True)
        sign = (bits >> 24) & 0x80
        mag = tl.abs(x)
        # Normal range (>= 2**-6): round the fp32 mantissa to 3 bits, then rebias the exponent from 127 to 7.
        m = mag.to(tl.uint32, bitcast=True)
        normal = ((m + 0x7FFFF + ((m >> 20) & 1)) >> 20) - (120 << 3)
        # Subnormal range: multiples of 2**-9; adding then subtracting 2**23 rounds to nearest even in fp32.
        sub = ((mag * 512.0 + 8388608.0) - 8388608.0).to(tl.uint32)
        code = tl.where(mag < 0.015625, sub, normal) | sign
        return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)

    @triton.jit
    def _load_rotary(src3, off, rows, ROTARY_DIM: tl.constexpr, BLOCK_HALF: tl.constexpr, IS_NEOX: tl.constexpr):
        """The rotary channels of ``R`` K tiles as stored (neox: its two halves, gptj: the interleaved pairs, twice).

        ``src3``: ``[1, BLOCK_T, 1]`` pointers to each lane's token; ``off``: ``[R, 1, 1]`` offsets of the tiles (a
        head, or a layer and a head) from there; ``rows``: ``[R, BLOCK_T, 1]``, which (tile, lane) exist.
        """
        if IS_NEOX:
            j = tl.arange(0, BLOCK_HALF)[None, None, :]
            mask = rows & (j < ROTARY_DIM // 2)
            off1 = off + j
            return tl.load(src3 + off1, mask=mask), tl.load(src3 + off1 + ROTARY_DIM // 2, mask=mask)
        else:
            cols = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
            x = tl.load(src3 + off + cols, mask=rows & (cols < ROTARY_DIM))
            return x, x

    @triton.jit
    def _store_rotated(
        dst3,
        off,
        rows,
        a,
        b,
        c,
        s,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        R: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Rotate what `_load_rotary` loaded in fp32 and store it, rounded, at ``dst3`` (``off`` and ``rows`` as
        there)."""
        if IS_NEOX:
            j = tl.arange(0, BLOCK_HALF)[None, None, :]
            mask = rows & (j < ROTARY_DIM // 2)
            off1 = off + j
            x1 = a.to(tl.float32)
            x2 = b.to(tl.float32)
            tl.store(dst3 + off1, _to_storage(x1 * c - x2 * s, dst3.dtype.element_ty, INTERPRETED), mask=mask)
            tl.store(
                dst3 + off1 + ROTARY_DIM // 2,
                _to_storage(x2 * c + x1 * s, dst3.dtype.element_ty, INTERPRETED),
                mask=mask,
            )
        else:
            cols = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
            x1, x2 = tl.split(tl.reshape(a.to(tl.float32), (R, BLOCK_T, BLOCK_HALF, 2)))
            out = tl.reshape(tl.join(x1 * c - x2 * s, x2 * c + x1 * s), (R, BLOCK_T, 2 * BLOCK_HALF))
            tl.store(
                dst3 + off + cols,
                _to_storage(out, dst3.dtype.element_ty, INTERPRETED),
                mask=rows & (cols < ROTARY_DIM),
            )

    @triton.jit
    def _rotate_heads(
        src,
        dst,
        live,
        cos,
        sin,
        stride_h,
        head_first,
        head_stop,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Rotate the first ROTARY_DIM channels of K of heads ``[head_first, head_stop)`` for the ``live`` lanes, one
        head at a time.

        ``src`` / ``dst`` point at head 0, channel 0 of each lane's token (``[BLOCK_T]`` pointers). fp8 codes are
        rotated as they are stored: the rotation is linear, so the layer's dequantization and requantization scales
        cancel (up to fp32 rounding, which the one-step bound covers) and need no multiply per element.
        """
        src3 = src[None, :, None]
        dst3 = dst[None, :, None]
        rows = live[None, :, None]
        c = cos[None, None, :]
        s = sin[None, None, :]
        for head in range(head_first, head_stop):
            off = head * stride_h
            a, b = _load_rotary(src3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            _store_rotated(dst3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, 1, BLOCK_HALF, IS_NEOX, INTERPRETED)

    @triton.jit
    def _copy_heads(
        src,
        dst,
        live,
        start: tl.constexpr,
        stop: tl.constexpr,
        stride_h,
        head_first,
        head_stop,
        BLOCK_HALF: tl.constexpr,
    ):
        """Copy channels ``[start, stop)`` of heads ``[head_first, head_stop)`` for the ``live`` lanes.

        In tiles of the rotation's shape, two per step, both loaded before either is stored: the lane pointers stay in
        one register layout for both paths.
        """
        j = tl.arange(0, BLOCK_HALF)[None, None, :]
        src3 = src[None, :, None]
        dst3 = dst[None, :, None]
        rows = live[None, :, None]
        for head in range(head_first, head_stop):
            for c0 in tl.static_range(start, stop, 2 * BLOCK_HALF):
                mask1 = rows & (c0 + j < stop)
                mask2 = rows & (c0 + BLOCK_HALF + j < stop)
                off1 = head * stride_h + c0 + j
                off2 = off1 + BLOCK_HALF
                x1 = tl.load(src3 + off1, mask=mask1)
                x2 = tl.load(src3 + off2, mask=mask2)
                tl.store(dst3 + off1, x1, mask=mask1)
                tl.store(dst3 + off2, x2, mask=mask2)

    @triton.jit
    def _group_rows(plan, first, count, COLS: tl.constexpr, DST: tl.constexpr, BLOCK_T: tl.constexpr):
        """For each lane, the row (counted from ``first``) of the group that writes it, or -1 where none does.

        A group is ``count`` (<= tokens_per_block) consecutive plan rows with one target block and one delta, so lane
        t stands for target slot t, each lane has at most one row, and partial rows share one tile.
        """
        j = tl.arange(0, BLOCK_T)
        rows = plan + (first + j) * COLS
        dst_off = tl.load(rows + DST + 1, mask=j < count, other=0)
        n_tokens = tl.load(rows + COLS - 2, mask=j < count, other=0)
        lane = j[:, None]
        match = (dst_off[None, :] <= lane) & (lane < (dst_off + n_tokens)[None, :])
        return tl.sum(tl.where(match, j[None, :] + 1, 0), axis=1) - 1

    @triton.jit
    def _program_range(count, per_program, axis: tl.constexpr):
        """This program's ``[first, stop)`` of ``count`` units dealt out ``per_program`` at a time along ``axis``."""
        first = tl.program_id(axis) * per_program
        return first, tl.minimum(first + per_program, count)

    @triton.jit
    def _load_group(desc):
        """A row group's rows, target block and delta (the rest of its descriptor is read where needed)."""
        return tl.load(desc + 1), tl.load(desc + 2), tl.load(desc + 3)

    @triton.jit
    def _copy_group(
        pool,
        plan,
        desc,
        inv_freq,
        layer_first,
        layer_stop,
        kv,
        head_first,
        head_stop,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Copy K (rotated by the group's delta) or V (``kv``) of the row group at ``desc``, layers
        ``[layer_first, layer_stop)`` and heads ``[head_first, head_stop)``."""
        count, block, delta = _load_group(desc)
        cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)
        lane = tl.arange(0, BLOCK_T)
        dst_lane = block * stride_b + lane.to(tl.int64) * stride_t
        if count == 1:  # one row: its slots and source come with the group (no trip to the plan)
            dst_off = tl.load(desc + 4)
            live = (lane >= dst_off) & (lane < dst_off + tl.load(desc + 5))
            src_lane = tl.load(desc + 6) * stride_b + (lane + tl.load(desc + 7)) * stride_t
        else:
            first = tl.load(desc)
            which = _group_rows(plan, first, count, 6, 2, BLOCK_T)
            live = which >= 0
            row = plan + (first + which) * 6
            src_block = tl.load(row, mask=live, other=0)
            shift = tl.load(row + 1, mask=live, other=0) - tl.load(row + 3, mask=live, other=0)
            src_lane = src_block * stride_b + (lane + shift) * stride_t
        for layer in range(layer_first, layer_stop):
            inner = layer * stride_l + kv * stride_kv  # below one block stride: int32 is enough
            src = pool + inner + src_lane
            dst = pool + inner + dst_lane
            if (kv == 1) | (delta == 0):
                _copy_heads(src, dst, live, 0, HEAD_DIM, stride_h, head_first, head_stop, BLOCK_HALF)
            else:
                _rotate_heads(
                    src,
                    dst,
                    live,
                    cos,
                    sin,
                    stride_h,
                    head_first,
                    head_stop,
                    ROTARY_DIM,
                    BLOCK_T,
                    BLOCK_HALF,
                    IS_NEOX,
                    INTERPRETED,
                )
                if ROTARY_DIM < HEAD_DIM:
                    _copy_heads(
                        src,
                        dst,
                        live,
                        ROTARY_DIM,
                        HEAD_DIM,
                        stride_h,
                        head_first,
                        head_stop,
                        BLOCK_HALF,
                    )

    @triton.jit
    def _inplace_group(
        pool,
        plan,
        desc,
        inv_freq,
        layer_first,
        layer_stop,
        head_first,
        head_stop,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
    ):
        """Rotate K of the row group at ``desc`` in place by the group's delta (0: nothing), layers
        ``[layer_first, layer_stop)`` and heads ``[head_first, head_stop)``."""
        count, block, delta = _load_group(desc)
        cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)
        if delta != 0:
            lane = tl.arange(0, BLOCK_T)
            k_lane = block * stride_b + lane.to(tl.int64) * stride_t
            if count == 1:  # one row: its slots come with the group (no trip to the plan)
                dst_off = tl.load(desc + 4)
                live = (lane >= dst_off) & (lane < dst_off + tl.load(desc + 5))
            else:
                live = _group_rows(plan, tl.load(desc), count, 4, 0, BLOCK_T) >= 0
            for layer in range(layer_first, layer_stop):
                k = pool + layer * stride_l + k_lane
                _rotate_heads(
                    k,
                    k,
                    live,
                    cos,
                    sin,
                    stride_h,
                    head_first,
                    head_stop,
                    ROTARY_DIM,
                    BLOCK_T,
                    BLOCK_HALF,
                    IS_NEOX,
                    INTERPRETED,
                )

    @triton.jit
    def _prefetch_l2(ptr, nbytes):
        """One bulk prefetch of ``nbytes`` (a multiple of 16) from ``ptr`` (16-byte aligned) into L2, issued by the
        program's thread 0 (sm_90's ``cp.async.bulk.prefetch.L2``; no registers held, nothing to wait for)."""
        addr = (ptr + tl.zeros([1], dtype=tl.int32)).to(tl.int64)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [addr, nbytes + tl.zeros([1], dtype=tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )

    @triton.jit
    def _inplace_one_group(
        pool,
        plan,
        desc,
        inv_freq,
        layer_first,
        layer_stop,
        head_first,
        head_stop,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        PREFETCH_ELEM_BYTES: tl.constexpr = 0,
    ):
        """Rotate K of the one row group at ``desc`` in place (delta 0: nothing), layers ``[layer_first,
        layer_stop)`` x heads ``[head_first, head_stop)``, one head tile at a time (heads counted fastest).

        The descriptor is read in one round trip (a one-row group's slots come with it), and the first tile's loads
        are issued before cos/sin are computed (`KernelTuning.one_trip_start`): the grid kernel reads the delta,
        computes cos/sin, reads the row count and block, then the slots, before its first data load.

        ``PREFETCH_ELEM_BYTES`` (`KernelTuning.l2_prefetch`): first, one bulk L2 prefetch per layer of the program's
        heads (contiguous, head-major)."""
        block, delta, live, _, _ = _whole_group(plan, desc, 4, 0, BLOCK_T, True)
        if PREFETCH_ELEM_BYTES != 0:  # noqa: SIM102 (a compile-time branch: off, the kernel has no trace of it)
            if delta != 0:
                chunk = pool + block * stride_b + head_first * stride_h
                nbytes = ((head_stop - head_first) * stride_h * PREFETCH_ELEM_BYTES).to(tl.int32)
                for layer in range(layer_first, layer_stop):
                    _prefetch_l2(chunk + layer * stride_l, nbytes)
        if delta != 0:
            k3 = (pool + block * stride_b + tl.arange(0, BLOCK_T).to(tl.int64) * stride_t)[None, :, None]
            rows = live[None, :, None]
            off = layer_first * stride_l + head_first * stride_h
            a, b = _load_rotary(k3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)  # while the first tile is in flight
            c = cos[None, None, :]
            s = sin[None, None, :]
            _store_rotated(k3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, 1, BLOCK_HALF, IS_NEOX, INTERPRETED)
            heads = head_stop - head_first
            next_layer = stride_l - heads * stride_h  # from a layer's last head to the next layer's first
            head = head_first
            for _t in range(1, (layer_stop - layer_first) * heads):
                head += 1
                off += stride_h
                if head == head_stop:
                    head = head_first
                    off += next_layer
                a, b = _load_rotary(k3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
                _store_rotated(k3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, 1, BLOCK_HALF, IS_NEOX, INTERPRETED)

    # Sizes that change from call to call are not specialized on (no recompiles on the serving path).
    _RUNTIME_SIZES = ["layer_start", "layer_stop", "layers_per_prog"]

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def rope_delta_copy_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
    ):
        """One program per (row group, run of layers, K|V x run of heads): gather the group's tokens, rotate K, write.
        Axis 2 counts head runs of K, then of V."""
        layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
        head_runs = tl.cdiv(num_heads, heads_per_prog)
        kv = tl.program_id(2) // head_runs
        head_first = (tl.program_id(2) % head_runs) * heads_per_prog
        head_stop = tl.minimum(head_first + heads_per_prog, num_heads)
        _copy_group(
            pool,
            plan,
            groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS,
            inv_freq,
            layer_start + layer_first,
            layer_start + layer_end,
            kv,
            head_first,
            head_stop,
            stride_b,
            stride_l,
            stride_kv,
            stride_h,
            stride_t,
            HEAD_DIM,
            ROTARY_DIM,
            BLOCK_T,
            BLOCK_HALF,
            IS_NEOX,
            INTERPRETED,
        )

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def rope_delta_inplace_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
        ONE_TRIP_START: tl.constexpr = False,
        PREFETCH_ELEM_BYTES: tl.constexpr = 0,
    ):
        """One program per (row group, run of layers, run of heads): rotate the group's K in place; delta 0 does
        nothing. ``ONE_TRIP_START``: `_inplace_one_group` (with its ``PREFETCH_ELEM_BYTES``)."""
        desc = groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS
        layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
        head_first, head_stop = _program_range(num_heads, heads_per_prog, 2)
        if ONE_TRIP_START:
            _inplace_one_group(
                pool,
                plan,
                desc,
                inv_freq,
                layer_start + layer_first,
                layer_start + layer_end,
                head_first,
                head_stop,
                stride_b,
                stride_l,
                stride_h,
                stride_t,
                ROTARY_DIM,
                BLOCK_T,
                BLOCK_HALF,
                IS_NEOX,
                INTERPRETED,
                PREFETCH_ELEM_BYTES,
            )
        else:
            _inplace_group(
                pool,
                plan,
                desc,
                inv_freq,
                layer_start + layer_first,
                layer_start + layer_end,
                head_first,
                head_stop,
                stride_b,
                stride_l,
                stride_h,
                stride_t,
                ROTARY_DIM,
                BLOCK_T,
                BLOCK_HALF,
                IS_NEOX,
                INTERPRETED,
            )

    @triton.jit
    def _tile_offsets(layer_first, layer_stop, head_first, head_stop, stride_l, stride_h, TILES: tl.constexpr):
        """A program's tiles, layers ``[layer_first, layer_stop)`` x heads ``[head_first, head_stop)`` (heads counted
        fastest): their offsets from a token's layer 0, head 0 and which exist, both ``[TILES, 1, 1]``."""
        t = tl.arange(0, TILES)
        heads = head_stop - head_first
        off = (layer_first + t // heads) * stride_l + (head_first + t % heads) * stride_h
        return off[:, None, None], (t < (layer_stop - layer_first) * heads)[:, None, None]

    @triton.jit
    def _whole_group(
        plan, desc, COLS: tl.constexpr, DST: tl.constexpr, BLOCK_T: tl.constexpr, ONE_TRIP: tl.constexpr = False
    ):
        """The row group at ``desc`` with every column read at once (one round trip: a one-row group's slots and
        source are not read after its row count): its target block, delta, and per lane whether a row writes it
        and that row's source block and source-minus-target offset (copy plans, ``COLS`` 6; zeros in place).

        ``ONE_TRIP``: a one-row group's lanes and source are computed before the branch on the row count; otherwise
        the compiler sinks the loads of its slots into that branch, after the row count has arrived (two round trips
        in the sm_90a SASS)."""
        first = tl.load(desc)
        count, block, delta = _load_group(desc)
        dst_off = tl.load(desc + 4)
        n_tokens = tl.load(desc + 5)
        one_src = tl.load(desc + 6)
        one_shift = tl.load(desc + 7)
        lane = tl.arange(0, BLOCK_T)
        zero = tl.zeros([BLOCK_T], dtype=tl.int64)
        if ONE_TRIP:
            live = (lane >= dst_off) & (lane < dst_off + n_tokens)
            src_block = zero + one_src
            shift = zero + one_shift
            if count != 1:
                which = _group_rows(plan, first, count, COLS, DST, BLOCK_T)
                live = which >= 0
                if COLS == 6:
                    row = plan + (first + which) * 6
                    src_block = tl.load(row, mask=live, other=0)
                    shift = tl.load(row + 1, mask=live, other=0) - tl.load(row + 3, mask=live, other=0)
        elif count == 1:
            live = (lane >= dst_off) & (lane < dst_off + n_tokens)
            src_block = zero + one_src
            shift = zero + one_shift
        else:
            which = _group_rows(plan, first, count, COLS, DST, BLOCK_T)
            live = which >= 0
            if COLS == 6:
                row = plan + (first + which) * 6
                src_block = tl.load(row, mask=live, other=0)
                shift = tl.load(row + 1, mask=live, other=0) - tl.load(row + 3, mask=live, other=0)
            else:
                src_block = zero
                shift = zero
        return block, delta, live, src_block, shift

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def rope_delta_copy_tiles_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_kv,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        HEAD_DIM: tl.constexpr,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        TILES: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        BLOCK_D: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
        ONE_TRIP_START: tl.constexpr = False,
    ):
        """One program per (row group, run of layers, K|V x run of heads) that loads all its tiles (one tensor of
        ``TILES`` x ``BLOCK_T`` lanes) before storing any; K is rotated, V copied. Axis 2 as in the grid kernel.
        ``ONE_TRIP_START``: `_whole_group`'s ``ONE_TRIP``."""
        block, delta, live, src_block, shift = _whole_group(
            plan, groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS, 6, 2, BLOCK_T, ONE_TRIP_START
        )
        layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
        head_runs = tl.cdiv(num_heads, heads_per_prog)
        kv = tl.program_id(2) // head_runs
        head_first = (tl.program_id(2) % head_runs) * heads_per_prog
        head_stop = tl.minimum(head_first + heads_per_prog, num_heads)
        lane = tl.arange(0, BLOCK_T)
        dst_lane = block * stride_b + lane.to(tl.int64) * stride_t
        src_lane = src_block * stride_b + (lane + shift) * stride_t
        off, tiles = _tile_offsets(
            layer_start + layer_first, layer_start + layer_end, head_first, head_stop, stride_l, stride_h, TILES
        )
        off = off + kv * stride_kv
        src3 = (pool + src_lane)[None, :, None]
        dst3 = (pool + dst_lane)[None, :, None]
        rows = tiles & live[None, :, None]
        d = tl.arange(0, BLOCK_D)[None, None, :]
        if (kv == 1) | (delta == 0):
            mask = rows & (d < HEAD_DIM)
            tl.store(dst3 + off + d, tl.load(src3 + off + d, mask=mask), mask=mask)
        else:
            if ROTARY_DIM < HEAD_DIM:  # channels past rotary_dim are copied: loaded with the rest
                rest = rows & (ROTARY_DIM + d < HEAD_DIM)
                kept = tl.load(src3 + off + ROTARY_DIM + d, mask=rest)
            a, b = _load_rotary(src3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)  # while the tiles are in flight
            c = cos[None, None, :]
            s = sin[None, None, :]
            _store_rotated(dst3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, TILES, BLOCK_HALF, IS_NEOX, INTERPRETED)
            if ROTARY_DIM < HEAD_DIM:
                tl.store(dst3 + off + ROTARY_DIM + d, kept, mask=rest)

    @triton.jit(do_not_specialize=_RUNTIME_SIZES)
    def rope_delta_inplace_tiles_kernel(
        pool,
        plan,
        groups,
        inv_freq,
        layer_start,
        layer_stop,
        layers_per_prog,
        stride_b,
        stride_l,
        stride_h,
        stride_t,
        num_heads,
        heads_per_prog,
        ROTARY_DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        TILES: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        IS_NEOX: tl.constexpr,
        INTERPRETED: tl.constexpr,
        GROUP_AXIS: tl.constexpr = 0,
        ONE_TRIP_START: tl.constexpr = False,
    ):
        """One program per (row group, run of layers, run of heads) that loads all its K tiles (one tensor of
        ``TILES`` x ``BLOCK_T`` lanes) before storing any: reads and writes go through the same pointer, so the
        compiler cannot overlap one tile's load with the previous tile's store; here every load is issued first.
        ``ONE_TRIP_START``: `_whole_group`'s ``ONE_TRIP``."""
        block, delta, live, _, _ = _whole_group(
            plan, groups + tl.program_id(GROUP_AXIS) * _GROUP_COLS, 4, 0, BLOCK_T, ONE_TRIP_START
        )
        if delta != 0:
            layer_first, layer_end = _program_range(layer_stop - layer_start, layers_per_prog, 1 - GROUP_AXIS)
            head_first, head_stop = _program_range(num_heads, heads_per_prog, 2)
            off, tiles = _tile_offsets(
                layer_start + layer_first, layer_start + layer_end, head_first, head_stop, stride_l, stride_h, TILES
            )
            k3 = (pool + block * stride_b + tl.arange(0, BLOCK_T).to(tl.int64) * stride_t)[None, :, None]
            rows = tiles & live[None, :, None]
            a, b = _load_rotary(k3, off, rows, ROTARY_DIM, BLOCK_HALF, IS_NEOX)
            cos, sin = _unit_cos_sin(inv_freq, delta, ROTARY_DIM, BLOCK_HALF)  # while the tiles are in flight
            c = cos[None, None, :]
            s = sin[None, None, :]
            _store_rotated(k3, off, rows, a, b, c, s, ROTARY_DIM, BLOCK_T, TILES, BLOCK_HALF, IS_NEOX, INTERPRETED)

    INTERPRETED = type(rope_delta_copy_kernel).__name__ == "InterpretedFunction"
else:
    INTERPRETED = False
