"""Check one session-15 setting (issue 16.4) on the GPU before it is timed: bf16 in place at Qwen2.5-7B and
Llama-3-8B 2K tokens, one call each against the torch reference, next to the library default's error on the same case.

    python3 benchmarks/results/kern15/preflight.py NAME   # NAME as bench_rope_delta.py prints it, e.g. h1w16l1b1r32p2+L+S+F+A4

Run by run_device.sh once per setting in its own process (a setting that faults the GPU cannot take the others
down); prints ``ok NAME ...`` and exits 0, or ``FAILED`` / ``WRONG`` and exits 1.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch
from bench_rope_delta import MODELS, SESSION15_SWEEP, case_default, check_matches_reference, make_case, short_name


def main() -> int:
    name = sys.argv[1]
    tuning = next(t for t in SESSION15_SWEEP["bf16", "inplace"] if short_name(t) == name)
    notes = []
    for model in ("Qwen2.5-7B", "Llama-3-8B"):
        case = make_case(MODELS[model], 2048, "cuda", torch.bfloat16)
        base = check_matches_reference(case, "inplace", case_default(case, "inplace"))
        try:
            err = check_matches_reference(case, "inplace", tuning)
            torch.cuda.synchronize()
        except Exception as e:
            print(f"FAILED {name} {model}: {type(e).__name__}: {str(e)[:400]}")
            return 1
        if err > 4 * max(base, 2**-8):
            print(f"WRONG {name} {model}: max |kernel - reference| {err:g} (default {base:g})")
            return 1
        notes.append(f"{model} {err:g} (default {base:g})")
    print(f"ok {name}: " + "; ".join(notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
