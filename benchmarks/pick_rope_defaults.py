"""The ``_DEFAULT_TUNINGS`` table of kernels/rope_delta/tuning.py from a ``bench_rope_delta.py --sweep-every-size`` run.

    python benchmarks/pick_rope_defaults.py bench.json     # the run's JSON (rows carry their size sweep)
    python benchmarks/pick_rope_defaults.py bench.txt      # or its printed output (runs before rows carried it)

Every benchmarked size (model x tokens; the odd-offset case counts with its aligned twin) gets the setting with the
lowest sum of its cases' times, each normalized to that case's best. A size's entry reaches up to the geometric
midpoint of its head-block count (row groups x layers x KV heads) and the next size's; neighbours with one setting
merge. Prints the table's lines, to paste over the old ones.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import fields

from bench_rope_delta import (
    MODELS,
    SIZE_SWEEP,
    SMOKE_MODELS,
    SWEEP,
    TOKENS_PER_BLOCK,
    UNALIGNED_DST_START,
    short_name,
)
from semblend_kernels.rope_delta import KernelTuning

_SWEEP_LINE = re.compile(r"\s+sweep (\S+) (\S+) (\d+) (\S+): best \S+; (.*)")


def head_blocks(model: str, tokens: int, unaligned: bool) -> int:
    layers, heads, _ = (MODELS | SMOKE_MODELS)[model]
    start = UNALIGNED_DST_START if unaligned else 0
    return -(-(start + tokens) // TOKENS_PER_BLOCK) * layers * heads


def sweeps_from_json(path: str) -> list[tuple[str, str, str, int, bool, dict[str, float]]]:
    with open(path) as f:
        rows = json.load(f)["rows"]
    missing = [r for r in rows if not r.get("size_sweep")]
    if missing:
        raise ValueError(f"{path}: {len(missing)} rows carry no size_sweep (run with --sweep-every-size on a GPU)")
    return [(r["dtype"], r["op"], r["model"], r["tokens"], r["unaligned"], r["size_sweep"]) for r in rows]


def sweeps_from_text(path: str) -> list[tuple[str, str, str, int, bool, dict[str, float]]]:
    """The printed sweep lines; a case's second sweep line is its odd-offset twin (the script prints those last)."""
    out, seen = [], set()
    with open(path) as f:
        for line in f:
            m = _SWEEP_LINE.match(line)
            if m:
                dtype, model, tokens, op, rest = m.groups()
                key = (dtype, model, tokens, op)
                times = {name: float(ms) for name, ms in (item.split("=") for item in rest.split())}
                out.append((dtype, op, model, int(tokens), key in seen, times))
                seen.add(key)
    return out


def pick(
    sweeps: list[tuple[str, str, str, int, bool, dict[str, float]]], settings: dict[str, KernelTuning]
) -> dict[tuple[bool, str], list[tuple[int, KernelTuning]]]:
    """Per (fp8, op): (head-block bound, tuning) entries, smallest size first; the last bound is open."""
    sizes: dict[tuple[bool, str], dict[tuple[str, int], list[dict[str, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for dtype, op, model, tokens, _, times in sweeps:
        sizes[dtype == "fp8", op][model, tokens].append(times)
    table = {}
    for key, by_size in sorted(sizes.items()):
        ordered = sorted(by_size.items(), key=lambda kv: head_blocks(kv[0][0], kv[0][1], False))
        entries: list[tuple[int, KernelTuning]] = []
        for i, (size, cases) in enumerate(ordered):
            common = set.intersection(*(set(c) & set(settings) for c in cases))
            if not common:
                raise ValueError(f"{key} {size}: no setting was timed in every case of this size")
            best = min(sorted(common), key=lambda name: sum(c[name] / min(c.values()) for c in cases))
            bound = 1 << 62
            if i + 1 < len(ordered):
                (model, tokens), (next_model, next_tokens) = size, ordered[i + 1][0]
                bound = math.isqrt(head_blocks(model, tokens, False) * head_blocks(next_model, next_tokens, False))
            if entries and entries[-1][1] == settings[best]:
                entries[-1] = (bound, settings[best])
            else:
                entries.append((bound, settings[best]))
        table[key] = entries
    return table


def literal(t: KernelTuning) -> str:
    """``KernelTuning(...)`` naming only the fields that differ from their defaults."""
    default = KernelTuning()
    args = [f"{f.name}={getattr(t, f.name)!r}" for f in fields(t) if getattr(t, f.name) != getattr(default, f.name)]
    return f"KernelTuning({', '.join(args)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", help="bench_rope_delta.py --sweep-every-size output: .json, or the printed .txt")
    args = parser.parse_args()
    try:
        sweeps = sweeps_from_json(args.results) if args.results.endswith(".json") else sweeps_from_text(args.results)
        table = pick(sweeps, {short_name(t): t for t in (*SIZE_SWEEP, *SWEEP)})
    except KeyError as e:
        print(f"pick_rope_defaults: {args.results} names a model this script does not know: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"pick_rope_defaults: {e}", file=sys.stderr)
        return 1
    if not table:
        print(f"pick_rope_defaults: no size sweeps in {args.results}", file=sys.stderr)
        return 1
    for (fp8, op), entries in table.items():
        for bound, tuning in entries:
            most = "1 << 62" if bound == 1 << 62 else str(bound)
            print(f'    ({fp8}, "{op}", {most}, {literal(tuning)}),')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
