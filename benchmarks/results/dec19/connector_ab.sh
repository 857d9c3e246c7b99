# connector_ab.sh [BASE_TREE] [ROUNDS]: dec19 (this checkout) against a base tree (default /tmp/tree-base: main's
# checkout), from this checkout's root. Both trees' compiled modules built in place for this Python; then
#  1. sched4/decisions_ab.py 100 file in each tree: the decisions and audit bytes must be identical (cmp);
#  2. align_ab.py: one process alternating this tree's and the base's sa_align per decision (hit, shifted hit);
#  3. bench_connector.py --prompt-tokens 8192 --requests 600 --mode shifted, the trees in turns, ROUNDS rounds (default
#     3): each case's p50 / p99.
# Each tree's root goes first on the PYTHONPATH the environment sets (.stage/fp/env.sh: the host's dependencies).
base=${1:-/tmp/tree-base}
rounds=${2:-3}
mods="semblend_dynamo._native trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation semblend_dynamo.native_entries"
for root in "$PWD" "$base"; do
  for m in $mods; do
    (cd "$root" && PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} python3 -m $m build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} >/dev/null 2>&1) \
      || (cd "$root" && PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} python3 -m $m build >/dev/null 2>&1) || echo "build $m failed in $root"
  done
done
out=$(mktemp -d)
for label in this base; do
  root=$([ $label = this ] && echo "$PWD" || echo "$base")
  (cd "$root" && PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/results/sched4/decisions_ab.py 100 file \
    >"$out/$label.txt" 2>/dev/null)
done
cmp "$out/this.txt" "$out/base.txt" && echo "decisions and audit bytes identical ($(wc -l <"$out/this.txt") lines)"
for case in hit shifted-hit; do
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/results/dec19/align_ab.py "$base" 3000 $case
done
for r in $(seq "$rounds"); do
  for label in this base; do
    root=$([ $label = this ] && echo "$PWD" || echo "$base")
    echo "== round $r $label"
    (cd "$root" && PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 600 --mode shifted \
      | tail -5)
  done
done
