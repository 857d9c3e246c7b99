#!/usr/bin/env bash
# session11/fleet_ab.sh with this tree's compiled entries built first (the staged env.sh builds only the modules it
# lists, which predate semblend_dynamo.native_entries):
#   bash benchmarks/results/fleet14/fleet_ab.sh DONORS ORDER...   (ORDER: base | this; output in $OUT)
set -uo pipefail
source .stage/fp/env.sh
python3 -m semblend_dynamo.native_entries build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} > /dev/null || echo "build native_entries failed"
python3 -m semblend_dynamo.native_entries status 2>&1 | tail -1 | tee "$OUT/native_entries_status.txt"
exec bash benchmarks/results/session11/fleet_ab.sh "$@"
