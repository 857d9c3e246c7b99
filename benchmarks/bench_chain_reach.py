"""Reach of the prefill chain: donor-covered tokens served from donor KV, per transform and prompt length.

Builds our SemBench-format workload (``benchmarks.quality.workload``: every transform, evidence sized to each token
budget) as manifests, then replays each through the connector harness in shifted mode twice in the same run: without
chains (the baseline) and with chains at each given per-step overhead. Prints, per budget and transform, the share of
donor-covered tokens served (exact prefix hits, connector loads, chain-step loads) and the negative controls'
false positives.

Usage: ``python -m benchmarks.bench_chain_reach --budgets 600,2000,8000 --overheads 128,256 [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.quality import workload
from semblend_apps.replay.connector_backend import ConnectorReplayBackend
from semblend_apps.replay.runner import run_replay
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.embedder import HashEmbedder
from semblend_dynamo.tokenizer import TokenizerAdapter


def replay(manifest: Path, audit: Path, **settings: Any) -> dict[str, Any]:
    cfg = SemblendConfig(
        exact_materialization_only=False, isolation="cache_salt", audit_path=str(audit), embedder="hash", **settings
    )
    backend = ConnectorReplayBackend(cfg)
    try:
        report = run_replay(cfg, backend=backend, embedder=HashEmbedder(), manifest=str(manifest))
    finally:
        backend.close()
    return {"reach": report.reach, "by_transform": report.by_transform, "declined": report.declined_by_reason}


def items(recs: list[workload.Record]) -> list[dict[str, Any]]:
    """Every reuse transform over all records but the last; the negative control asks about the last record.

    Replay keeps every item's donors resident together, so a negative control must ask about evidence that no
    item's donor holds (the quality benchmark's own negative control is built for one item per engine).
    """
    reuse = [t for t in workload.TRANSFORMS if t != "negative_control"]
    out = workload.build(recs[:-1], reuse)
    return [*out, workload.item(recs[-1], "negative_control", len(recs) - 1, recs[0])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="600,2000,8000", help="evidence token budgets, one record pair each")
    parser.add_argument("--records", type=int, default=2, help="records per budget")
    parser.add_argument("--overheads", default="128,256", help="chain_step_overhead_tokens values to compare")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    args = parser.parse_args(argv)
    tokenizer = TokenizerAdapter.from_config(SemblendConfig().tokenizer)
    count = lambda text: len(tokenizer.encode(text))  # noqa: E731
    arms: list[tuple[str, dict[str, Any]]] = [("no chain", {"chain_enabled": False})]
    arms += [
        (f"chain, overhead {o}", {"chain_enabled": True, "chain_step_overhead_tokens": int(o)})
        for o in args.overheads.split(",")
    ]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for budget in (int(b) for b in args.budgets.split(",")):
            manifest = Path(tmp) / f"reach-{budget}.jsonl"
            workload.write_manifest(manifest, items(list(workload.records([budget] * (args.records + 1), count))))
            out[str(budget)] = {name: replay(manifest, Path(tmp) / "audit.jsonl", **s) for name, s in arms}
    for budget, by_arm in out.items():
        print(f"\nevidence budget {budget} tokens: share of donor-covered tokens served from donor KV")
        names = list(by_arm)
        print(f"  {'transform':<27}" + "".join(f"{n:>22}" for n in names))
        for t in next(iter(by_arm.values()))["by_transform"]:
            cells = []
            for n in names:
                row = by_arm[n]["by_transform"][t]
                cov = row["donor_covered_tokens"]
                cells.append(f"{row['served_tokens']}/{cov} ({row['served_tokens'] / cov:.0%})" if cov else "-")
            print(f"  {t:<27}" + "".join(f"{c:>22}" for c in cells))
        print(f"  {'all reuse transforms':<27}" + "".join(f"{by_arm[n]['reach']['share']:>22.1%}" for n in names))
        for n in names:
            if by_arm[n]["declined"]:
                print(f"  declined ({n}): {by_arm[n]['declined']}")
        print(
            f"  {'negative-control false +':<27}"
            + "".join(f"{by_arm[n]['reach']['negative_control_false_positives']:>22}" for n in names)
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
