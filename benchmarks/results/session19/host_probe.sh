# Session 19: is the H200 host's CPU slow per instruction or per cache miss, and where a decision's time goes there.
# From the repo root, with .stage (pkgs, fp, pyinc) carried: bash benchmarks/results/session19/host_probe.sh
source .stage/fp/env.sh >/dev/null 2>&1 || true
lscpu | grep -E "Model name|MHz|L1d|L2|L3"; python3 -V
for m in semblend_dynamo._native trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation semblend_dynamo.native_entries; do
  PYTHONPATH=$PWD:/tmp/pr:/tmp/semdev/site python3 -m $m build >/dev/null 2>&1 || echo "build $m failed"
done
echo "== clock"
cc -O2 -o /tmp/clock benchmarks/results/session19/clock.c && /tmp/clock && /tmp/clock
echo "== dependent-load latency"
cc -O2 -o /tmp/memlat benchmarks/results/session18/memlat.c
for s in 16384 262144 1048576 2097152 4194304 33554432; do /tmp/memlat $s 64; done
export PYTHONPATH=$PWD:/tmp/pr:/tmp/semdev/site
echo "== decision steps, hit"
python3 benchmarks/results/sched4/decide_steps.py 2000 shifted hit
echo "== decision steps, shifted hit"
python3 benchmarks/results/sched4/decide_steps.py 2000 shifted shifted-hit | tail -16
echo "== aligner in the flow"
python3 benchmarks/results/sched17/align_in_flow.py 1500 shifted hit
echo "== bench_connector"
for r in 1 2; do python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted | tail -5; done
