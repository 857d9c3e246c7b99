# connector_ab.sh ROUNDS: bench_connector (8K, shifted, 2,000 requests a case) for this checkout and the base tree
# (/tmp/tree-base, made by .stage/old/mkbase.sh from .stage/old/base.patch), alternating, ROUNDS rounds; each tree's
# compiled modules built in place for this Python. From the repo root on the quiet host, after `source .stage/fp/env.sh`.
rounds=${1:-3}
mods="semblend_dynamo._native trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation semblend_dynamo.native_entries"
[ -d /tmp/tree-base ] || { mkdir -p /tmp/tree-base && tar -xJf .stage/old/base.tar.xz -C /tmp/tree-base; }
for root in "$PWD" /tmp/tree-base; do
  for m in $mods; do
    (cd "$root" && PYTHONPATH=$root:/tmp/pr:/tmp/semdev/site python3 -m $m build ${SEMBLEND_CC:+--cc "$SEMBLEND_CC"} \
      >/dev/null 2>&1) || (cd "$root" && PYTHONPATH=$root:/tmp/pr:/tmp/semdev/site python3 -m $m build >/dev/null 2>&1) \
      || echo "build $m failed in $root"
  done
done
for r in $(seq "$rounds"); do
  for label in this base; do
    root=$([ $label = this ] && echo "$PWD" || echo /tmp/tree-base)
    echo "== round $r $label"
    (cd "$root" && PYTHONPATH=$root:/tmp/pr:/tmp/semdev/site python3 benchmarks/bench_connector.py --prompt-tokens 8192 \
      --requests 2000 --mode shifted | tail -5)
  done
done
