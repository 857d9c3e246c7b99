"""Compile the in-place grid kernel for sm_90a with Triton's bundled ptxas (no GPU) with and without the session-14 L2
prefetch: registers, stack, static and Triton shared memory, a SASS hash, and bulk-prefetch / load / store counts. (The
TMA-tile step it also compiled in its first version was removed after the H200 run: docs/benchmarks.md; the 4-warp
bf16 case was added in session 15, its output in benchmarks/results/kern15/compiled_sass.txt.)

    python benchmarks/results/kern13/compiled_sass.py [grid] [NAME-SUBSTRING ...]   # kernels/ importable as semblend_kernels
"""

import hashlib
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
import triton
from semblend_kernels import rope_delta
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

CUOBJ = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
ALIGNED = ("pool", "plan", "groups", "inv_freq", "stride_b", "stride_l", "stride_h", "stride_t")


def build(fp8, warps, cap, extra, one_trip=True, style_neox=True, axis=1):
    k = rope_delta._rope_delta_inplace_kernel
    names = list(k.arg_names)
    el = "fp8e4nv" if fp8 else "bf16"
    sig = {"pool": f"*{el}", "plan": "*i64", "groups": "*i64", "inv_freq": "*fp32"}
    consts = dict(
        ROTARY_DIM=128,
        BLOCK_T=32,
        HEADS_PER_ITER=1,
        BLOCK_HALF=64,
        IS_NEOX=style_neox,
        INTERPRETED=False,
        PIPELINE=False,
        GROUP_AXIS=axis,
    )
    if one_trip:
        consts["ONE_TRIP_START"] = True
    consts |= extra
    for n in names:
        if n in sig:
            continue
        if n in consts:
            sig[n] = "constexpr"
        elif n in ("PREFETCH_ELEM_BYTES", "ONE_TRIP_START", "GROUP_AXIS"):
            pass
        else:
            sig[n] = "i32"
    # constexprs with defaults that were not given: ASTSource needs every parameter
    for n in names:
        if n not in sig:
            sig[n] = "constexpr"
            consts.setdefault(n, {"PREFETCH_ELEM_BYTES": 0, "ONE_TRIP_START": False, "GROUP_AXIS": 0}[n])
    src = ASTSource(
        k,
        sig,
        constexprs={(names.index(a),): v for a, v in consts.items() if a in names},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED if n in names},
    )
    opts = {"num_warps": warps}
    if cap:
        opts["maxnreg"] = cap
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        res = subprocess.run([CUOBJ, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([CUOBJ, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    body = "\n".join(re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass))
    h = hashlib.sha1(re.sub(r"\s+", " ", body).encode()).hexdigest()[:12]
    ops = {}
    for op in ("UBLKPF", "LDG", "STG", "LDS", "STS", "BAR"):
        ops[op] = len(re.findall(r"\b" + op + r"\b", sass))
    return (m.groups() if m else res[:200]) + (c.metadata.shared,), h, ops, c


if __name__ == "__main__":
    pf = {"PREFETCH_ELEM_BYTES": 2}
    cases = [
        ("default bf16 16w/40", False, 16, 40, {}),
        ("default fp8-ish 4w", True, 4, None, {}),
        ("prefetch bf16 16w/40", False, 16, 40, pf),
        ("prefetch bf16 16w/32", False, 16, 32, pf),
        ("prefetch bf16 8w/32", False, 8, 32, pf),
        ("prefetch bf16 8w/40", False, 8, 40, pf),
        ("prefetch bf16 8w/64", False, 8, 64, pf),
        ("prefetch bf16 8w/-", False, 8, None, pf),
        ("prefetch bf16 4w/-", False, 4, None, pf),
        ("prefetch fp8 4w", True, 4, None, {"PREFETCH_ELEM_BYTES": 1}),
    ]
    only = sys.argv[1:]
    if "grid" in only:
        for fp8, w, cap, axis in ((False, 16, 40, 0), (True, 4, 64, 0), (False, 8, 64, 1)):
            usage, h, ops, _ = build(fp8, w, cap, {}, one_trip=False, axis=axis)
            print(f"grid fp8={fp8} {w}/{cap} axis {axis}: {usage} sass {h}", flush=True)
        only = ["default"]
    for name, fp8, w, cap, extra in cases:
        if only and not any(o in name for o in only):
            continue
        try:
            usage, h, ops, _ = build(fp8, w, cap, extra)
            print(f"{name}: reg/stack/smem {usage} sass {h} {ops}", flush=True)
        except Exception as e:
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:600]}", flush=True)
