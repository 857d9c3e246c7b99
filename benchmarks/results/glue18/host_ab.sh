# glue18 on the quiet host: this tree ($PWD) against a base tree at /tmp/tree-base, alternating, on the host's Python.
# From the repo root, with .stage (pkgs, fp, pyinc) carried and the base tree copied to /tmp/tree-base:
#   bash benchmarks/results/glue18/host_ab.sh
source .stage/fp/env.sh >/dev/null 2>&1 || true  # PYTHONPATH=$PWD:/tmp/pr:/tmp/semdev/site; builds this tree's modules
python3 -V
B=/tmp/tree-base
for m in semblend_dynamo._native trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation; do
  if [ -n "${SEMBLEND_CC:-}" ] && [ "$m" != semblend_dynamo._native ]; then
    (cd $B && PYTHONPATH=$B:/tmp/pr:/tmp/semdev/site python3 -m $m build --cc "$SEMBLEND_CC" >/dev/null) || echo "base: build $m failed"
  else
    (cd $B && PYTHONPATH=$B:/tmp/pr:/tmp/semdev/site python3 -m $m build >/dev/null) || echo "base: build $m failed"
  fi
done
python3 -c "from semblend_dynamo import span_aligner as s; print('this tree:', s.NATIVE_SPANS_REASON)"
echo "== the compiled spans vs ctypes + _spans_of, alternating per decision in one process (this tree)"
python3 benchmarks/results/glue18/spans_ab.py 3000 shifted hit
python3 benchmarks/results/glue18/spans_ab.py 3000 shifted shifted-hit
echo "== sched15 sub-steps (shifted hit), base then this tree"
for t in $B $PWD; do (cd $t && PYTHONPATH=$t:/tmp/pr:/tmp/semdev/site python3 benchmarks/results/sched15/sub_steps.py 1200 shifted hit); done
echo "== bench_connector (8K, shifted), base and this tree alternating"
for r in 1 2 3; do
  for t in $B $PWD; do
    echo "-- round $r $t"
    (cd $t && PYTHONPATH=$t:/tmp/pr:/tmp/semdev/site python3 benchmarks/bench_connector.py --prompt-tokens 8192 \
      --requests 1000 --mode shifted | tail -5)
  done
done
