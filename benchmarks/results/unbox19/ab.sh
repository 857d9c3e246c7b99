# ab.sh [BASE_TREE] [ROUNDS]: unbox19 (this checkout) against a base tree (default /tmp/tree-base: main's checkout),
# from this checkout's root. Both trees' compiled modules built in place for this Python (this tree's
# `python -m trtllm_connector.unbox build` builds the _unbox extension module, the base's its ctypes library); then
#  1. sched4/decisions_ab.py 100 file in each tree: the decisions and audit bytes must be identical (cmp);
#  2. unbox_ab.py: one process alternating the base's and this tree's u32_prompt per decision, ROUNDS rounds (default
#     3) of hit, shifted-hit, miss: u32_prompt's and the decision's p50 / p90 / p99 per variant;
#  3. bench_connector.py --prompt-tokens 8192 --requests 600 --mode shifted, the trees in turns, ROUNDS rounds.
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
(PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 -m trtllm_connector.unbox status)
out=$(mktemp -d)
for label in this base; do
  root=$([ $label = this ] && echo "$PWD" || echo "$base")
  (cd "$root" && PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/results/sched4/decisions_ab.py 100 file \
    >"$out/$label.txt" 2>/dev/null)
done
cmp "$out/this.txt" "$out/base.txt" && echo "decisions and audit bytes identical ($(wc -l <"$out/this.txt") lines)"
for r in $(seq "$rounds"); do
  for case in hit shifted-hit miss; do
    echo "== round $r $case"
    PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/results/unbox19/unbox_ab.py "$base" 1400 $case
  done
done
for r in $(seq "$rounds"); do
  for label in this base; do
    root=$([ $label = this ] && echo "$PWD" || echo "$base")
    echo "== round $r $label"
    (cd "$root" && PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 600 --mode shifted \
      | tail -5)
  done
done
