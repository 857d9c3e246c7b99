#!/bin/bash
# Issue 16.2 (sched3), one device call on a quiet 16-core host: bench_connector at 8K in exact mode, main (the repo
# root as carried) against branch sched3 (its changed files in .stage/sched3/overlay/), 3 runs alternating, then the
# same with a 3M-object heap and TensorRT-LLM's gen-0 GC threshold, and with another busy Python thread; the per-step
# breakdown (decide_steps.py) and the probes (decision_probes.py) in each tree; then the paired A/B (lockstep_ab.py),
# exact (2,000) and shifted (1,000).
# Both sides run sched3's bench_connector.py (requests finish after their iteration; main's copy never finishes
# them), so only the connector code differs. STAGES (default "bench probes paired") picks the parts: the whole may
# take ~10 minutes on a host ~2x slower per thread than the VM, so run it as two calls under the 600 s limit,
# STAGES="bench probes" then STAGES=paired.
# Stage from a checkout of main with branch sched3 available (here), then run on the device with carry [".stage/sched3"]:
#   mkdir -p .stage/sched3/wheels .stage/sched3/overlay
#   for f in run_device.sh lockstep_ab.py decision_probes.py; do
#     git show sched3:benchmarks/results/sched3/$f > .stage/sched3/$f; done
#   cp benchmarks/results/sched4/decide_steps.py .stage/sched3/  # its successor: defaults give the same run
#   cp <cp312 wheels: pydantic, pydantic_core, annotated_types, typing_inspection, xxhash, PyYAML, msgpack,
#       prometheus_client, tqdm> .stage/sched3/wheels/
#   git diff --name-only main...sched3 -- semblend_dynamo trtllm_connector benchmarks/bench_connector.py \
#     | xargs -I{} sh -c 'mkdir -p .stage/sched3/overlay/$(dirname {}) && git show sched3:{} > .stage/sched3/overlay/{}'
#   command: bash .stage/sched3/run_device.sh
set -u
root=$PWD
runs=${RUNS:-3} requests=${REQUESTS:-2000} paired=${PAIRED:-2000} stages=${STAGES:-bench probes paired}
python3 -c "import pydantic, xxhash, yaml, msgpack, prometheus_client, tqdm" 2>/dev/null \
  || python3 -m pip install -q --no-deps --target /tmp/site .stage/sched3/wheels/*.whl
for name in main sched3; do
  rm -rf /tmp/ab3/$name && mkdir -p /tmp/ab3/$name/.pp
  cp -r "$root"/semblend_dynamo "$root"/trtllm_connector "$root"/kernels "$root"/benchmarks /tmp/ab3/$name/
  ln -sfn /tmp/ab3/$name/kernels /tmp/ab3/$name/.pp/semblend_kernels
done
cp -r "$root"/.stage/sched3/overlay/. /tmp/ab3/sched3/
cp /tmp/ab3/sched3/benchmarks/bench_connector.py /tmp/ab3/main/benchmarks/bench_connector.py
(cd /tmp/ab3 && diff -rq main sched3 | grep -v "^Only in\|\.pp") > "$OUT/diff_main_sched3.txt"
{ uptime; nproc; lscpu | grep -i "model name\|cache"; python3 -V; python3 -c "import numpy; print('numpy', numpy.__version__)"; } > "$OUT/host.txt" 2>&1
bench() {  # name outfile args...
  local name=$1 out=$2; shift 2
  (cd /tmp/ab3/$name && PYTHONPATH=/tmp/ab3/$name:/tmp/ab3/$name/.pp:/tmp/site timeout 240 \
    python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests "$requests" "$@") > "$OUT/$out" 2>&1
  echo "== $out"; grep "^| SemBlend" "$OUT/$out" | cut -c1-160
}
stage() { [[ " $stages " == *" $1 "* ]]; }
if stage bench; then
  for run in $(seq 1 "$runs"); do
    for name in main sched3; do bench $name ${name}_exact_run${run}.txt --mode exact; done
  done
  for name in main sched3; do
    bench $name ${name}_exact_heap3m.txt --mode exact --heap-objects 3000000 --gc-threshold 20000
    bench $name ${name}_exact_busy200.txt --mode exact --busy-thread-us 200
  done
fi
stage probes && for name in main sched3; do
  for probe in decide_steps decision_probes; do
    (cd /tmp/ab3/$name && PYTHONPATH=/tmp/ab3/$name:/tmp/ab3/$name/.pp:/tmp/site timeout 120 \
      python3 "$root"/.stage/sched3/$probe.py "$requests") > "$OUT/${probe}_$name.txt" 2>&1
  done
  tail -1 "$OUT/decide_steps_$name.txt"; cat "$OUT/decision_probes_$name.txt"
done
stage paired && for mode in exact shifted; do
  n=$paired; [ $mode = shifted ] && n=$((paired / 2))
  PYTHONPATH=/tmp/ab3/main/.pp:/tmp/site timeout 240 python3 "$root"/.stage/sched3/lockstep_ab.py $mode $n \
    /tmp/ab3/main python3 /tmp/ab3/sched3 python3 > "$OUT/lockstep_$mode.txt" 2>&1
  cat "$OUT/lockstep_$mode.txt"
done
