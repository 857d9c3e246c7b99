# ab.sh BASE_TREE [ROUNDS]: metrics20 (this checkout) against a base tree (main's checkout),
# from this checkout's root. Both trees' compiled modules built in place for this Python; then
#  1. sched4/decisions_ab.py 100 file in each tree: the decisions and audit bytes must be identical (cmp);
#  2. metrics_ab.py: one process, the variant per decision (a coin per pair), ROUNDS rounds (default 3) of hit,
#     shifted-hit, miss: the decision's p50 / p90 / p99 per variant and the median per-pair difference.
base=${1:?usage: ab.sh BASE_TREE [ROUNDS]}
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
for r in $(seq "$rounds"); do
  for case in hit shifted-hit miss; do
    echo "== round $r"
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/results/metrics20/metrics_ab.py "$base" 3000 $case
  done
done
