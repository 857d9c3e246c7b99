"""Registers, stack and a hash of the sm_90a SASS of every RoPE-delta kernel, for diffing two versions of the code.

    PYTHONPATH=<dir holding semblend_kernels>:. python benchmarks/results/kern7b/compiled_sass.py out.json 0
    PYTHONPATH=<dir holding semblend_kernels>:. python benchmarks/results/kern7b/compiled_sass.py out.json 1

The second argument is ``GROUP_AXIS`` (1: layers-fastest; only the grid and load-all-tiles kernels). Compiles each
kernel x bf16/fp8 x (rotary 128 NeoX at 4:- 4:64 8:- 16:40 8:64 warps:cap, heads per iteration / tiles 1 or 2; rotary
128 GPT-J and rotary 64 NeoX / GPT-J at 8:- and 4:-; axis 1: rotary 128 NeoX only) with Triton's bundled ptxas, as
``benchmarks/rope_delta_registers.py`` does, and prints one line per compile. Constexprs the kernels do not take are
dropped, so the same constants compile main's kernels (which had the session-10 cache-hint / unmasked / fp16
constexprs, passed here at their off values) and the pruned ones.
"""

from __future__ import annotations

import hashlib
import json
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

_ALIGNED = ("pool", "plan", "groups", "inv_freq", "stride_b", "stride_l", "stride_kv", "stride_h", "stride_t")
_CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
_LAUNCHES_FULL = [(4, None, 1), (4, 64, 2), (8, None, 1), (16, 40, 1), (8, 64, 1)]
_LAUNCHES_SHORT = [(8, None, 1), (4, None, 1)]


def compile_one(kernel: object, fp8: bool, warps: int, cap: int | None, constants: dict[str, object]) -> dict:
    names = list(kernel.arg_names)  # type: ignore[attr-defined]
    consts = {k: v for k, v in constants.items() if k in names}
    sig = {"pool": "*fp8e4nv" if fp8 else "*bf16", "plan": "*i64", "groups": "*i64", "inv_freq": "*fp32"}
    sig |= {n: "constexpr" if n in consts else "i32" for n in names if n not in sig}
    source = ASTSource(
        kernel,
        sig,
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in _ALIGNED if n in names},
    )
    options: dict[str, object] = {"num_warps": warps} | ({"maxnreg": cap} if cap else {})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([_CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([_CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    sass = "\n".join(line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line))
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", res)
    assert m is not None, res[:200]
    return {"regs": m.groups(), "sass": hashlib.sha1(sass.encode()).hexdigest()[:12], "n": sass.count("\n")}


def main() -> int:
    out_path, group_axis = sys.argv[1], int(sys.argv[2])
    base = {
        "HEAD_DIM": 128,
        "BLOCK_D": 128,
        "BLOCK_T": 32,
        "INTERPRETED": False,
        "PIPELINE": False,
        "LOAD_HINT": "",
        "STORE_HINT": "",
        "FULL_TILES": False,
        "F16": False,
        "GROUP_AXIS": group_axis,
    }
    variants = [{"ROTARY_DIM": r, "BLOCK_HALF": r // 2, "IS_NEOX": neox} for r in (128, 64) for neox in (True, False)]
    out = {}
    for name in ("inplace", "inplace_persistent", "inplace_tiles", "copy", "copy_persistent", "copy_tiles"):
        kernel = getattr(rope_delta, f"_rope_delta_{name}_kernel")
        if group_axis and "GROUP_AXIS" not in kernel.arg_names:
            continue
        for fp8 in (False, True):
            for vi, v in enumerate(variants if group_axis == 0 else variants[:1]):
                for warps, cap, per in _LAUNCHES_FULL if vi == 0 else _LAUNCHES_SHORT:
                    constants = base | v | {"HEADS_PER_ITER": per, "TILES": 4 * per}
                    style = "neox" if v["IS_NEOX"] else "gptj"
                    key = f"{name} {'fp8' if fp8 else 'bf16'} rot{v['ROTARY_DIM']} {style} w{warps} r{cap} h/t{per}"
                    out[key] = compile_one(kernel, fp8, warps, cap, constants)
                    print(key, out[key], flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
