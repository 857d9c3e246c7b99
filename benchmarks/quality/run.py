"""Quality of materialized KV on SmolLM2-135M-Instruct (CPU), per SemBench transform and reuse mode.

Builds a SemBench-format manifest from the bundled corpus (or reads ``--manifest``), runs every item cold and under
every mode through the reference engine (the real SemBlend connector over a paged KV pool in TensorRT-LLM's layout),
and writes under ``--out``: ``manifest.jsonl``, ``rows.jsonl`` (one row per item and mode), ``summary.json``,
``summary.md`` (the table docs/quality.md carries) and ``quality_vs_share.png``.

    python -m benchmarks.quality.run --out results/quality
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.quality import workload
from benchmarks.quality.evaluate import ItemEvaluator
from benchmarks.quality.modes import MODES, ChainMode, chain_gate, connector_config
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.planner import Planner
from semblend_dynamo.span_aligner import Span

COLD_EQUIVALENT = {
    "materialized": 0,
    "share": 0.0,
    "mean_kl": 0.0,
    "max_kl": 0.0,
    "top1_agreement": 1.0,
    "greedy_exact_match": True,
    "rouge_l_vs_cold": 1.0,
    "ppl_ratio": 1.0,
    "acceptable": True,
}
GATED = ("shifted", "chain_")
"""Modes run with their gate open: their table shows them as the gate decides and, as ``<mode>_ungated``, as run."""


def gated(mode: str) -> bool:
    return mode == GATED[0] or mode.startswith(GATED[1])


def views(rows: list[dict[str, Any]]) -> list[str]:
    """Table views of the modes present: each mode, and ``<mode>_ungated`` for gated modes."""
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    return [v for m in modes for v in ((m, f"{m}_ungated") if gated(m) else (m,))]


def view(row: dict[str, Any], name: str) -> dict[str, Any] | None:
    """``row`` as seen in table view ``name`` (a gate-declined row of a gated mode runs cold in the plain view)."""
    if name.endswith("_ungated"):
        return row if row["mode"] == name.removesuffix("_ungated") else None
    if row["mode"] != name:
        return None
    if gated(name) and row["materialized"] and row.get("gate") != "accepted":
        return {**row, **COLD_EQUIVALENT, "task_warm": row["task_cold"], "declined": {row["gate"]: 1}}
    return row


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (transform, view): means over the items, materialized items counted."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    names = views(rows)
    for row in rows:
        for name in names:
            seen = view(row, name)
            if seen is not None:
                groups[(row["transform"], name)].append(seen)
    out = []
    order = {t: i for i, t in enumerate(workload.TRANSFORMS)}
    rank = {v: i for i, v in enumerate(names)}
    for (transform, name), group in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), rank[kv[0][1]])):
        n = len(group)

        def mean(key: str, g: list[dict[str, Any]] = group) -> float:
            return sum(float(r[key]) for r in g) / max(len(g), 1)

        declined: Counter[str] = Counter()
        for r in group:
            if not r["materialized"]:
                declined.update(r["declined"])
        out.append(
            {
                "transform": transform,
                "mode": name,
                "items": n,
                "prompt_tokens": f"{min(r['prompt_tokens'] for r in group)}-{max(r['prompt_tokens'] for r in group)}",
                "materialized_items": sum(1 for r in group if r["materialized"]),
                "share": mean("share"),
                "mean_kl": mean("mean_kl"),
                "max_kl": max(float(r["max_kl"]) for r in group),
                "top1_agreement": mean("top1_agreement"),
                "greedy_exact_match": mean("greedy_exact_match"),
                "rouge_l_vs_cold": mean("rouge_l_vs_cold"),
                "ppl_ratio": mean("ppl_ratio"),
                "task_cold": mean("task_cold"),
                "task_warm": mean("task_warm"),
                "unacceptable": sum(1 for r in group if r["materialized"] and not r["acceptable"]),
                "declined": dict(declined),
            }
        )
    return out


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
    if isinstance(x, dict):
        return ", ".join(f"{k}:{v}" for k, v in x.items()) or "-"
    return str(x)


def markdown(summary: list[dict[str, Any]]) -> str:
    cols = list(summary[0]) if summary else []
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(s[c]) for c in cols) + " |" for s in summary]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Mean KL over the answer tokens against materialized share, every materialization (gate open), by transform.

    Skipped with a notice where matplotlib is not installed (the ``bench`` extra has it).
    """
    try:
        import matplotlib
    except ImportError:
        print(f"[quality] notice: matplotlib not installed, {path.name} not drawn", file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    markers = dict(zip(workload.TRANSFORMS, "osD^v<>x", strict=True))
    for transform in workload.TRANSFORMS:
        for mode, fill in (("exact", "full"), ("shifted", "none")):
            pts = [r for r in rows if r["transform"] == transform and r["mode"] == mode and r["materialized"]]
            if not pts:
                continue
            ax.scatter(
                [r["share"] for r in pts],
                [max(r["mean_kl"], 1e-7) for r in pts],
                marker=markers[transform],
                facecolors="C0" if mode == "exact" else "none",
                edgecolors="C0" if mode == "exact" else ["C2" if r.get("gate") == "accepted" else "C3" for r in pts],
                label=f"{transform} ({mode}{'' if fill == 'full' else ', green=gate accepts, red=declines'})",
            )
    ax.axhline(0.05, color="grey", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("materialized share of the prompt")
    ax.set_ylabel("mean KL(cold || warm) over answer tokens")
    ax.set_title("SmolLM2-135M-Instruct: quality loss vs materialized share (1e-7 = identical)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/quality"))
    parser.add_argument(
        "--manifest", type=Path, default=None, help="a SemBench manifest to run instead of building one"
    )
    parser.add_argument(
        "--budgets", default="1000,1500,2500", help="evidence tokens per record (one record each; 8 items per record)"
    )
    parser.add_argument("--transforms", default=",".join(workload.TRANSFORMS))
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared 2-core box)")
    parser.add_argument(
        "--from-rows",
        type=Path,
        nargs="+",
        default=None,
        help="summarize these rows.jsonl files (of earlier runs) only",
    )
    args = parser.parse_args(argv)
    # the command a summary records, without this machine's path to the script
    command = ["python", "-m", "benchmarks.quality.run", *(sys.argv[1:] if argv is None else argv)]
    if args.from_rows:
        rows = [json.loads(line) for path in args.from_rows for line in path.read_text().splitlines() if line.strip()]
        args.out.mkdir(parents=True, exist_ok=True)
        write_summary(rows, args.out, {"argv": command, "from_rows": [str(p) for p in args.from_rows]})
        return 0
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; known: {list(MODES)}")
    torch.set_num_threads(args.threads)
    from semblend_apps.reference_engine.smollm2 import ModelNotInstalled, load_smollm2

    started = time.perf_counter()
    try:
        tokenizer, model = load_smollm2()
    except ModelNotInstalled as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.manifest is not None:
        try:
            items = workload.read_manifest(args.manifest)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:

        def count(text: str) -> int:
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

        recs = list(workload.records([int(b) for b in args.budgets.split(",")], count))
        items = workload.build(recs, args.transforms.split(","))
    workload.write_manifest(args.out / "manifest.jsonl", items)
    evaluator = ItemEvaluator(
        model, tokenizer, {m: MODES[m] for m in args.modes.split(",")}, answer_tokens=args.answer_tokens
    )
    hardware = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}"
    print(
        f"[quality] {len(items)} items, modes {args.modes}; model loaded in {time.perf_counter() - started:.0f}s",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    tty = sys.stderr.isatty()
    with (args.out / "rows.jsonl").open("w") as sink, tqdm(total=len(items), disable=not tty, unit="item") as bar:
        for k, item in enumerate(items, 1):
            for row in evaluator.rows(item):
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            bar.update()
            if not tty:
                print(f"[quality] {k}/{len(items)} items, {time.perf_counter() - started:.0f}s", flush=True)
    meta = {"argv": command, "hardware": hardware, "seconds": time.perf_counter() - started, "items": len(items)}
    write_summary(rows, args.out, meta)
    print(f"[quality] done in {meta['seconds']:.0f}s -> {args.out}")
    return 0


def regate(rows: list[dict[str, Any]]) -> None:
    """Replay the current gates on each gated row's recorded spans (a plan re-plans to itself, so this is the gate of
    the current code even for rows of an earlier run); the verdict at run time is kept as ``gate_at_run``."""
    planner = Planner(connector_config("shifted"))
    for row in rows:
        if row["mode"].startswith(GATED[1]) and "chain_spans" in row:
            row.setdefault("gate_at_run", row.get("gate"))
            mode = MODES.get(row["mode"])
            if isinstance(mode, ChainMode):
                row["gate"] = chain_gate(mode, row["prompt_tokens"], row["chain_spans"])
            continue
        if row["mode"] != "shifted" or not row["spans"]:
            continue
        spans = [
            Span(donor_id=f"s{i}", donor_start=start - delta, target_start=start, length=length)
            for i, (start, length, delta) in enumerate(row["spans"])
        ]
        verdict = planner.plan(row["prompt_tokens"], spans)
        row.setdefault("gate_at_run", row.get("gate"))
        row["gate"] = "accepted" if verdict.accepted else str(verdict.reason.value if verdict.reason else "none")
        if verdict.plan is not None:
            row["estimated_deviation"] = verdict.plan.estimated_deviation
        elif verdict.reason is DeclineReason.DEVIATION_TOO_HIGH:
            row["estimated_deviation"] = float(verdict.detail.split()[2])


def write_summary(rows: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    """``summary.json``, ``summary.md`` and the plot under ``out``; the table on stdout."""
    regate(rows)
    summary = summarize(rows)
    (out / "summary.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "gate": gate_report(rows)}, indent=1)
    )
    (out / "summary.md").write_text(json.dumps(meta) + "\n\n" + markdown(summary))
    plot(rows, out / "quality_vs_share.png")
    print(markdown(summary))
    print(json.dumps(gate_report(rows), indent=1))


def gate_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per gated mode: its materializations (gate open) split by the gate's verdict, each with the quality bar's."""

    def brief(r: dict[str, Any]) -> dict[str, Any]:
        keys = ("transform", "prompt_tokens", "spans", "estimated_deviation", "mean_kl", "task_cold", "task_warm")
        return {k: r.get(k) for k in keys} | {"materialized": r["materialized"], "acceptable": r["acceptable"]}

    out: dict[str, Any] = {}
    for mode in dict.fromkeys(r["mode"] for r in rows if gated(r["mode"])):
        runs = [
            r
            for r in rows
            if r["mode"] == mode and r["materialized"] and (mode != "shifted" or r.get("plan_mode") == "shifted")
        ]
        accepted = [brief(r) for r in runs if r.get("gate") == "accepted"]
        declined = [brief(r) | {"gate": r.get("gate")} for r in runs if r.get("gate") != "accepted"]
        out[mode] = {
            "accepted": len(accepted),
            "accepted_unacceptable": sum(1 for r in accepted if not r["acceptable"]),
            "declined": len(declined),
            "declined_unacceptable": sum(1 for r in declined if not r["acceptable"]),
            "accepted_cases": accepted,
            "declined_cases": declined,
        }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
