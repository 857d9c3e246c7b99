"""Session 28: what the bf16 in-place default moves at Qwen2.5-7B 2K, from the GPU's own counters (issue 16.4).

Runs the default launch of ``bench_rope_delta.py``'s case (and, for a reference with the same access pattern, the
copy kernel's default at the same size) a few times; meant to run under Nsight Compute, which reads DRAM and L2
bytes, throughput and occupancy per launch:

    ncu --clock-control none --kernel-name regex:rope --launch-skip 2 --launch-count 2 --metrics M1,M2,... \
        python3 benchmarks/results/session28/ncu_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[2])]

from bench_rope_delta import case_default, kernel_fn, make_case  # noqa: E402

case = make_case((28, 4, 128), 2048, "cuda", torch.bfloat16)
tuning = case_default(case, "inplace")
inplace = kernel_fn(case, "inplace", tuning)
copy = kernel_fn(case, "copy", case_default(case, "copy"))
print(f"in place {tuning}; K bytes {case.k_bytes}", flush=True)
for _ in range(4):
    inplace()
    copy()
torch.cuda.synchronize()
