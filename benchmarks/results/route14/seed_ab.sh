#!/usr/bin/env bash
# seed_ab.sh DONORS ROUNDS [QUERIES]: the Frontend benchmark's seeding in-process, one donor at a time (the reference,
# the benchmark's seeding up to session 14) and in bulk (session 14's), in turns (one first in odd rounds, bulk first
# in even ones), each in its own process; one JSON line per seeding (seconds, the state's digests, what the
# benchmark's prompts find). Run from the repo root.
set -u
donors=$1; rounds=$2; queries=${3:-50}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="one bulk"; else order="bulk one"; fi
  for s in $order; do
    python -m benchmarks.frontend_path.seed_check --donors "$donors" --seeding "$s" --queries "$queries"
  done
done
