"""The span path's steps, each timed on its own around the router's own objects (session 16, branch gate16): the
gate's pieces (``_blocks_to_win``, the two blocks' slices, Dynamo's hash, ``stored_together``), ``find_spans``'
(``_target``, the digest, the lock and table, ``align``'s checks, the views, the target's address, the compiled
call, the rows' ``tolist``, the ``Span`` objects). µs p50 over 60 prompts x 30 (warm) or x 3 with 256 MB written
through the caches before each prompt (``cold``: an upper bound, the interpreter's own code cold too).

Usage: ``PYTHONPATH=TREE python benchmarks/results/gate16/span_path_steps.py TREE DONORS [cold]``.
"""

import asyncio
import gc
import sys
import time

TREE = sys.argv[1]
sys.path[:0] = [TREE, TREE + "/benchmarks"]
import numpy as np  # noqa: E402
from dynamo.llm import compute_block_hash_for_seq  # noqa: E402
from router_under_test import span_path_router, span_target  # noqa: E402

from semblend_dynamo import _native  # noqa: E402
from semblend_dynamo.outcomes import Outcome  # noqa: E402
from semblend_dynamo.pipeline import _target  # noqa: E402
from semblend_dynamo.router.handler import Decision, _blocks_to_win  # noqa: E402

pc = time.perf_counter


async def main():
    router, donors, rng = await span_path_router(int(sys.argv[2]))
    prompts = [router.parse({"token_ids": span_target(rng, donors)}) for _ in range(60)]
    d = router.discovery
    al = d.aligner
    cold = len(sys.argv) > 3
    junk = np.ones(256 << 20, dtype=np.uint8)
    names = [
        "decision",
        "btw",
        "slices",
        "hash",
        "stored",
        "target",
        "digest",
        "lock+tables",
        "asc",
        "allowed",
        "work",
        "tview",
        "bview",
        "holdgil",
        "addr",
        "call",
        "tolist",
        "spans",
    ]
    acc = {n: [] for n in names}
    d.find_spans(prompts[0].namespace, prompts[0].token_array)
    gc.disable()
    for _ in range(3 if cold else 30):
        for r in prompts:
            if cold:
                junk += 1
            t = [pc()]
            Decision(Outcome.COLD_FALLBACK)
            t.append(pc())
            tokens, size = r.tokens, router.cfg.block_size
            needed = _blocks_to_win(len(tokens), size, router.cfg.exact_route_threshold)
            t.append(pc())
            fl = tokens[:size] + tokens[(needed - 1) * size : needed * size]
            t.append(pc())
            hs = compute_block_hash_for_seq(fl, size, lora_name=r.lora or None, cache_namespace=r.cache_salt or None)
            t.append(pc())
            assert router.catalog.stored_together(hs) is False
            t.append(pc())
            target = _target(r.token_array)
            t.append(pc())
            dg = r.namespace.digest()
            t.append(pc())
            with d._lock:
                table = al._tables.get(dg)
                t.append(pc())
                tt = np.ascontiguousarray(target, dtype=al.dtype)
                _ = tt.ndim
                _ = tt.size
                t.append(pc())
                al._allowed_serials(dg, None)
                t.append(pc())
                ms = min(2 * d.cfg.max_spans, 64)
                assert al._work_for == (tt.size, ms)
                t.append(pc())
                tv = table.native_view()
                t.append(pc())
                bv = al._book.native_view()
                t.append(pc())
                hg = al.hold_gil is not None and al.hold_gil()
                t.append(pc())
                _native.array_address(tt)
                t.append(pc())
                found = al._call.run(tv, bv, tt, ms, None, hold_gil=hg)
                t.append(pc())
                rows = al._work[: 4 * found].tolist()
                t.append(pc())
                spans = al._spans_of(rows)
                t.append(pc())
            for i, n in enumerate(names):
                acc[n].append((t[i + 1] - t[i]) * 1e6)
    tot = 0
    for n in names:
        v = sorted(acc[n])
        p = v[len(v) // 2]
        tot += p
        print(f"{n:12s} {p:7.2f}")
    print("sum", round(tot, 1), "spans", len(spans))


asyncio.run(main())
