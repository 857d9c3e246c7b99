#!/usr/bin/env bash
# frontend_ab.sh DONORS REQS ORDER...: route12's script (same staging, same runs, output in $OUT; see there), then each
# run's graph-up time. Session 14's seeding (benchmarks/frontend_path/seeded_router.py, the donors in bulk) brings the
# 100K-donor graph up in about a third of the time, so one 600-s call holds four runs, e.g.
# `bash benchmarks/results/route14/frontend_ab.sh 100000 300 this this this this`.
set -uo pipefail
bash benchmarks/results/route12/frontend_ab.sh "$@"
grep -H "graph up" "$OUT"/frontend_*.txt
