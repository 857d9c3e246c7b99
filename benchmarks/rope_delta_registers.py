"""Registers and stack (spills) per thread of the RoPE-delta kernels compiled for sm_90a, without a GPU.

    python benchmarks/rope_delta_registers.py [--tiles 4] [--style gptj] [--launch 8:64 ...]
        [--layers-fastest] [--one-trip-start] [--sass-counts] [--kernels inplace,inplace_tiles]

Compiles both kernels (grid and load-all-tiles, whose programs load ``--tiles`` (layer x head) tiles at
once; copy and in place; bf16 and fp8; head_dim 128, 32-token blocks) with
Triton's bundled ptxas and reads the counts with its cuobjdump. ``--launch WARPS:CAP`` (cap ``-``: none) may repeat.
Arguments are specialized as on a real launch (16-byte aligned pointers and strides), so the counts are the GPU's
for the same Triton version; the GPU machine may run another Triton, whose compiler can count differently.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret (set before the kernels module is imported)

import triton
from semblend_kernels.rope_delta import triton_kernels
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_ALIGNED = ("pool", "plan", "groups", "inv_freq", "stride_b", "stride_l", "stride_kv", "stride_h", "stride_t")
_CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def usage(
    kernel: object, fp8: bool, warps: int, cap: int | None, constants: dict[str, object], sass: bool = False
) -> tuple[int, int, str]:
    """(registers, stack bytes, SASS instruction counts if ``sass``) per thread of ``kernel`` for these constants and
    launch."""
    names = list(kernel.arg_names)  # type: ignore[attr-defined]
    signature = {"pool": "*fp8e4nv" if fp8 else "*bf16", "plan": "*i64", "groups": "*i64", "inv_freq": "*fp32"}
    consts = {k: v for k, v in constants.items() if k in names}
    signature |= {n: "constexpr" if n in consts else "i32" for n in names if n not in signature}
    source = ASTSource(
        kernel,
        signature,
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in _ALIGNED if n in names},
    )
    options: dict[str, object] = {"num_warps": warps}
    if cap is not None:
        options["maxnreg"] = cap
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([_CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        listing = subprocess.run([_CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    if m is None:
        raise RuntimeError(f"no register count in cuobjdump's output: {out[:200]}")
    return int(m.group(1)), int(m.group(2)), sass_counts(listing) if sass else ""


_COUNTED = ("LDG", "STG", "FFMA", "FMUL", "FADD", "HFMA2", "HMUL2", "HADD2", "F2FP", "F2F", "PRMT", "ISETP")


def sass_counts(listing: str) -> str:
    """Static counts of a few SASS opcodes (each instruction once, loops not unrolled by this count)."""
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", listing)
    counts = {op: sum(1 for o in ops if o == op) for op in _COUNTED}
    return " ".join(f"{op}={n}" for op, n in counts.items() if n) + f" total={len(ops)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiles", type=int, default=4, help="tiles per program of the load-all-tiles kernels")
    parser.add_argument("--style", choices=["neox", "gptj"], default="neox")
    parser.add_argument("--launch", action="append", help="WARPS:CAP, cap '-' for none (default: 4:- 4:64 8:- 16:40)")
    parser.add_argument("--layers-fastest", action="store_true", help="KernelTuning.layers_fastest")
    parser.add_argument(
        "--one-trip-start", action="store_true", help="KernelTuning.one_trip_start (in-place grid, load-all-tiles)"
    )
    parser.add_argument("--sass-counts", action="store_true", help="also count LDG/STG/FFMA/HFMA2/F2FP/... in the SASS")
    parser.add_argument("--kernels", default="", help="comma-separated subset (e.g. inplace,inplace_tiles)")
    args = parser.parse_args()
    try:
        launches = [(int(w), None if c == "-" else int(c)) for w, c in (s.split(":") for s in args.launch or [])]
    except ValueError:
        print("rope_delta_registers: --launch takes WARPS:CAP, e.g. 8:64 or 4:-", file=sys.stderr)
        return 1
    constants = {
        "HEAD_DIM": 128,
        "ROTARY_DIM": 128,
        "BLOCK_T": 32,
        "BLOCK_HALF": 64,
        "IS_NEOX": args.style == "neox",
        "INTERPRETED": False,
        "TILES": args.tiles,
        "BLOCK_D": 128,
        "GROUP_AXIS": 1 if args.layers_fastest else 0,
        "ONE_TRIP_START": args.one_trip_start,  # a kernel's constexpr left out would compile as a runtime argument
    }
    names = ("inplace", "inplace_tiles", "copy", "copy_tiles")
    chosen = [n for n in names if not args.kernels or n in args.kernels.split(",")]
    print(
        "| kernel | dtype | warps | register cap | registers | stack bytes |"
        + (" SASS |\n|---|---|---|---|---|---|---|" if args.sass_counts else "\n|---|---|---|---|---|---|")
    )
    for name in chosen:
        kernel = getattr(triton_kernels, f"rope_delta_{name}_kernel")
        for fp8 in (False, True):
            for warps, cap in launches or [(4, None), (4, 64), (8, None), (16, 40)]:
                regs, stack, sass = usage(kernel, fp8, warps, cap, constants, args.sass_counts)
                extra = f" {sass} |" if args.sass_counts else ""
                print(f"| {name} | {'fp8' if fp8 else 'bf16'} | {warps} | {cap or '-'} | {regs} | {stack} |{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
