"""Paired A/B of bench_connector's decision path: two trees' schedulers in two processes, decisions one by one.

``python3 lockstep_ab.py MODE N TREE_A PYTHON_A TREE_B PYTHON_B [no-finish]``: each process builds bench_connector's
scheduler and prompts (same seeds, so the same prompts), then the driver alternates them per request (A B, B A, ...),
so both see the same machine load and the same cache pressure from the other. Prints p50/p99 per case and how often
B was faster in a pair. A process is started with ``--worker MODE N FINISH`` in its tree (its ``benchmarks/`` on the
path). After its iteration each request is finished without offering its blocks (``request_finished(request, [])``,
as bench_connector does), unless ``no-finish`` is given (how the issue16-sched2 runs were made: per-request state
then grows for the whole run).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys


def worker(mode: str, n: int, finish: bool) -> None:
    import argparse
    import random
    import tempfile
    import time
    from pathlib import Path

    sys.path.insert(0, "benchmarks")
    import bench_connector as bc

    from semblend_dynamo.events.schemas import DonorHint, request_key
    from trtllm_connector.base import SchedulerOutput
    from trtllm_connector.harness import HarnessRequest

    args = argparse.Namespace(prompt_tokens=8192, pinned_blocks=10_000, requests=n, mode=mode, audit="file")
    sched, donors = bc.build_scheduler(args, Path(tempfile.mkdtemp()) / "audit.jsonl")
    rng = random.Random(1)
    tpb, cut = bc.TPB, 8192 * 3 // 4

    def fresh(k: int) -> list[int]:
        return [rng.randrange(1, 32000) for _ in range(k)]

    misses = [fresh(8192) for _ in range(n)]
    hits = [rng.choice(donors)[:cut] + fresh(8192 - cut) for _ in range(n)]
    shift = tpb + tpb // 4
    shifted = [rng.choice(donors)[shift : shift + cut] + fresh(8192 - cut) for _ in hits]
    hinted = hits[: n // 2]
    namespace = sched.model.namespace().digest()
    for tokens in hinted:
        index = next(i for i, d in enumerate(donors) if d[:tpb] == tokens[:tpb])
        donor_id = sched.registry.donor_id_for(index + 1)
        hint = DonorHint(
            request_key=request_key(tokens),
            donor_id=donor_id,
            worker_id=0,
            namespace=namespace,
            decision="semantic_placement",
        )
        sched.hints.submit(hint)
    cases = {"miss": misses, "hit": hits, "shifted": shifted, "hinted": hinted}
    block = 20_000
    print("ready", flush=True)
    for request_id, line in enumerate(sys.stdin, start=10_000_000):
        case, i = line.split()
        request = HarnessRequest(request_id, cases[case][int(i)])
        t0 = time.perf_counter()
        promised = sched.get_num_new_matched_tokens(request, 0)[0]
        dt = (time.perf_counter() - t0) * 1e6
        k = -(-request.prompt_len // tpb)
        sched.update_state_after_alloc(request, list(range(block, block + k)))
        block += k
        sched.build_connector_meta(SchedulerOutput())
        if finish:
            sched.request_finished(request, [])  # no blocks offered: not a donor, the donor set stays
        print(f"{dt:.2f} {promised}", flush=True)


def main() -> None:
    mode, n = sys.argv[1], int(sys.argv[2])
    sides = {"A": (sys.argv[3], sys.argv[4]), "B": (sys.argv[5], sys.argv[6])}
    finish = "0" if sys.argv[7:] == ["no-finish"] else "1"
    me = os.path.abspath(__file__)
    procs = {}
    for name, (tree, python) in sides.items():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p))
        procs[name] = subprocess.Popen(
            [python, me, "--worker", mode, str(n), finish],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for p in procs.values():
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    cases = ["miss", "hit"] + (["shifted"] if mode == "shifted" else []) + ["hinted"]
    print(
        f"lockstep A/B, mode {mode}, prompt 8192, {n} requests per case (hinted {n // 2}), requests "
        f"{'finished' if finish == '1' else 'left unfinished'}; A = {sides['A'][0]}, B = {sides['B'][0]}; µs"
    )
    print("| case | A p50 | B p50 | A p99 | B p99 | B faster in (pairs) |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        times: dict[str, list[float]] = {k: [] for k in procs}
        promised: dict[str, list[int]] = {k: [] for k in procs}
        for i in range(n // 2 if case == "hinted" else n):
            for k in ("A", "B") if i % 2 == 0 else ("B", "A"):
                p = procs[k]
                assert p.stdin is not None and p.stdout is not None
                p.stdin.write(f"{case} {i}\n")
                p.stdin.flush()
                dt, got = p.stdout.readline().split()
                times[k].append(float(dt))
                promised[k].append(int(got))
        assert promised["A"] == promised["B"], f"{case}: the two trees promised differently"

        def p99(v: list[float]) -> float:
            return sorted(v)[min(len(v) - 1, int(0.99 * len(v)))]

        a, b = times["A"], times["B"]
        wins = sum(y < x for x, y in zip(a, b, strict=True)) / len(a)
        print(
            f"| {case} | {statistics.median(a):.1f} | {statistics.median(b):.1f} | {p99(a):.1f} | {p99(b):.1f} | {wins:.0%} |",
            flush=True,
        )
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.close()
        p.wait()


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
    else:
        main()
