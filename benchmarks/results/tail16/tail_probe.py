"""Per-decision counters in bench_connector's flow (issue 16.2, tail16): what the slowest decisions have in common.

``python benchmarks/results/tail16/tail_probe.py [--requests N] [--mode shifted|exact] [--top 0.02] [--dump F]`` from
a tree's root (bench_connector.py's build_scheduler, prompt recipes and per-request settle calls). Each SemBlend
decision is timed (wall clock and thread CPU) with, around it:

- the process's minor and major page faults (``getrusage``: a trimmed heap or an mmapped temporary faults again);
- the thread's voluntary and involuntary context switches;
- the garbage collections that started inside it (``gc.callbacks``);
- the change of glibc's heap (``mallinfo2``: arena bytes, mmapped bytes), when glibc has it;
- the CPU it ran on (``sched_getcpu`` before and after): "moved" = it started on another CPU than the previous
  decision ended on, or changed CPU inside;
- a canary: a fixed piece of work (Python calls and numpy passes, ~20-40 µs) timed right before and right after the
  decision (a machine slow at that moment slows the canary too).

For each case the table compares the slowest ``--top`` share of decisions (by wall clock) with the rest, and the
decisions that page-faulted with those that did not; "next to slow" is the share of the group whose neighbour
decision (i - 1 or i + 1) is among the case's slowest 5% (slowness in bursts, not in single decisions). The first 200
decisions of a case are left out (warm-up).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, "benchmarks")
import bench_connector as bc

from trtllm_connector.base import SchedulerOutput
from trtllm_connector.harness import HarnessRequest

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_CANARY_ARRAY = np.arange(4096, dtype=np.uint32)
FIELDS = (
    "wall_us",
    "cpu_us",
    "minflt",
    "majflt",
    "vcsw",
    "ivcsw",
    "gc",
    "arena_delta",
    "mmap_delta",
    "moved",
    "canary_us",
)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo() -> Callable[[], _Mallinfo2] | None:
    f = getattr(_LIBC, "mallinfo2", None)
    if f is None:
        return None
    f.restype = _Mallinfo2
    return f


def canary() -> float:
    """A fixed piece of work like the decision's (Python calls, numpy passes over 16 KB), in µs of thread CPU."""
    c = time.thread_time_ns()
    total = 0
    for i in range(300):
        total += i & 7
    np.cumsum(_CANARY_ARRAY)
    bytes(_CANARY_ARRAY).count(b"\x01")
    return (time.thread_time_ns() - c) / 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--mode", default="shifted")
    p.add_argument("--top", type=float, default=0.02)
    p.add_argument("--dump", default="", help="write every decision's counters to this TSV")
    a = p.parse_args()
    args = argparse.Namespace(
        prompt_tokens=8192, pinned_blocks=10_000, requests=a.requests, mode=a.mode, audit="file", no_finish=False
    )
    mallinfo = _mallinfo()
    getcpu = _LIBC.sched_getcpu
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        sched, donors = bc.build_scheduler(args, Path(tmp) / "audit.jsonl")
        cut = 8192 * 3 // 4

        def fresh(n: int) -> list[int]:
            return [rng.randrange(1, 32000) for _ in range(n)]

        misses = [fresh(8192) for _ in range(a.requests)]
        hits = [rng.choice(donors)[:cut] + fresh(8192 - cut) for _ in range(a.requests)]
        shift = bc.TPB + bc.TPB // 4
        shifted = [rng.choice(donors)[shift : shift + cut] + fresh(8192 - cut) for _ in hits]
        target = [20_000]

        def settle(request: HarnessRequest) -> None:
            n = -(-request.prompt_len // bc.TPB)
            sched.update_state_after_alloc(request, list(range(target[0], target[0] + n)))
            target[0] += n
            sched.build_connector_meta(SchedulerOutput())
            sched.request_finished(request, [])

        gc.collect()
        gcs = [0]
        active = [False]

        def on_gc(phase: str, info: dict[str, int]) -> None:
            gcs[0] += phase == "start" and active[0]

        gc.callbacks.append(on_gc)
        cases = {"miss": misses, "hit (local lookup)": hits}
        if a.mode == "shifted":
            cases["shifted hit (local search)"] = shifted
        rows: dict[str, list[tuple[float, ...]]] = {}
        last_cpu = getcpu()
        for name, prompts in cases.items():
            out = rows[name] = []
            for i, tokens in enumerate(prompts):
                request = HarnessRequest(10_000_000 + i, tokens)
                k0 = canary()
                m0 = mallinfo() if mallinfo else None
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                t0r = resource.getrusage(resource.RUSAGE_THREAD)
                g0 = gcs[0]
                cpu0 = getcpu()
                active[0] = True
                c0 = time.thread_time_ns()
                t0 = time.perf_counter_ns()
                sched.get_num_new_matched_tokens(request, 0)
                t1 = time.perf_counter_ns()
                c1 = time.thread_time_ns()
                active[0] = False
                cpu1 = getcpu()
                t1r = resource.getrusage(resource.RUSAGE_THREAD)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                m1 = mallinfo() if mallinfo else None
                k1 = canary()
                moved = int(cpu0 != last_cpu or cpu1 != cpu0)
                last_cpu = cpu1
                out.append(
                    (
                        (t1 - t0) / 1e3,
                        (c1 - c0) / 1e3,
                        r1.ru_minflt - r0.ru_minflt,
                        r1.ru_majflt - r0.ru_majflt,
                        t1r.ru_nvcsw - t0r.ru_nvcsw,
                        t1r.ru_nivcsw - t0r.ru_nivcsw,
                        gcs[0] - g0,
                        (m1.arena - m0.arena) if m0 and m1 else 0,
                        (m1.hblkhd - m0.hblkhd) if m0 and m1 else 0,
                        moved,
                        (k0 + k1) / 2,
                    )
                )
                settle(request)
        sched.audit.close()
    if a.dump:
        with open(a.dump, "w") as f:
            f.write("\t".join(("case", "i", *FIELDS)) + "\n")
            for name, out in rows.items():
                for i, r in enumerate(out):
                    f.write("\t".join((name, str(i), *(f"{x:.1f}" if isinstance(x, float) else str(x) for x in r))))
                    f.write("\n")
    print(
        f"mode {a.mode}, {a.requests} requests a case (the first 200 left out), slowest {a.top:.0%} against the rest;"
        f" python {sys.version.split()[0]}, mallinfo2 {'yes' if mallinfo else 'no'}"
    )
    print(
        "| case | group | n | wall p50 / mean (µs) | CPU mean (µs) | minor faults mean / share > 0 | major faults "
        "| vol / invol switches (share) | GCs | heap shrank / grew (share) | mmapped changed (share) | moved CPU (share) "
        "| canary mean (µs) | next to slow |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, all_rows in rows.items():
        out = [(*r, float(i)) for i, r in enumerate(all_rows[200:])]
        order = sorted(out, key=lambda r: r[0])
        k = max(1, int(len(order) * a.top))
        slow5 = {r[-1] for r in order[-max(1, len(order) // 20) :]}

        def next_to_slow(r: tuple[float, ...], slow5: set[float] = slow5) -> bool:
            return r[-1] - 1 in slow5 or r[-1] + 1 in slow5

        groups = (
            ("slowest", order[-k:]),
            ("rest", order[:-k]),
            ("faulted", [r for r in out if r[2] > 0]),
            ("no fault", [r for r in out if r[2] == 0]),
        )
        for group, rs in groups:
            n = len(rs)
            if not n:
                print(f"| {name} | {group} | 0 |" + " |" * 11)
                continue
            w = [r[0] for r in rs]

            def share(pred: Callable[[tuple[float, ...]], bool], rs: list[tuple[float, ...]] = rs) -> str:
                return f"{sum(map(pred, rs)) / len(rs):.0%}"

            print(
                f"| {name} | {group} | {n} | {statistics.median(w):.1f} / {statistics.fmean(w):.1f} "
                f"| {statistics.fmean(r[1] for r in rs):.1f} "
                f"| {statistics.fmean(r[2] for r in rs):.2f} / {share(lambda r: r[2] > 0)} | {sum(r[3] for r in rs):.0f} "
                f"| {share(lambda r: r[4] > 0)} / {share(lambda r: r[5] > 0)} | {sum(r[6] for r in rs):.0f} "
                f"| {share(lambda r: r[7] < 0)} / {share(lambda r: r[7] > 0)} | {share(lambda r: r[8] != 0)} "
                f"| {share(lambda r: r[9] > 0)} | {statistics.fmean(r[10] for r in rs):.1f} "
                f"| {share(next_to_slow)} |"
            )
        walls = sorted(r[0] for r in out)
        cpus = sorted(r[1] for r in out)
        print(
            f"| {name} | all | {len(out)} | p50 {walls[len(walls) // 2]:.1f}, p99 {walls[int(0.99 * len(walls))]:.1f}"
            f" | CPU p99 {cpus[int(0.99 * len(cpus))]:.1f} | faults/decision {statistics.fmean(r[2] for r in out):.3f}"
            f" | {sum(r[3] for r in out):.0f} | | {sum(r[6] for r in out):.0f} | | | {moved_share(out)} | | |"
        )


def moved_share(out: list[tuple[float, ...]]) -> str:
    return f"{sum(r[9] > 0 for r in out) / len(out):.0%}"


if __name__ == "__main__":
    main()
