"""Session 28: the bf16 in-place rotation at Qwen2.5-7B 2K against torch kernels that touch the same bytes, each
launch read by Nsight Compute (issue 16.4).

Each callable runs twice (the second launch is the one to read): the default in-place launch, the all-heads one-trip
setting, torch's in-place ``mul_`` over the K chunks of 64 consecutive blocks (the rotation's access pattern: 32 KB
of K a block and layer, 32 KB of V skipped), the same ``mul_`` over a contiguous buffer of the same size, and torch's
``copy_`` of that many bytes (a memcpy, which Nsight Compute does not read as a kernel)::

    ncu --clock-control none --metrics M1,M2,... python3 benchmarks/results/session28/ncu_ceiling.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[2])]

from bench_rope_delta import case_default, kernel_fn, make_case  # noqa: E402

case = make_case((28, 4, 128), 2048, "cuda", torch.bfloat16)
default = case_default(case, "inplace")
runs = {
    "default": kernel_fn(case, "inplace", default),
    "all heads": kernel_fn(case, "inplace", replace(default, heads_per_program=None, l2_prefetch=False)),
}
k_chunks = case.pool[:64, :, 0]  # [64 blocks, 28 layers, 16384]: 32 KB of K each, 32 KB of V between
assert k_chunks.numel() * 2 == case.k_bytes
flat = torch.empty(case.k_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
other = torch.empty_like(flat)
runs["mul_ K chunks"] = lambda: k_chunks.mul_(1.0)
runs["mul_ contiguous"] = lambda: flat.mul_(1.0)
runs["copy_"] = lambda: other.copy_(flat)
for name, fn in runs.items():
    print(f"== {name}", flush=True)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
