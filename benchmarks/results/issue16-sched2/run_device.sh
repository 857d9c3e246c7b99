#!/bin/bash
# Issue 16.2 (sched2), one device call: bench_connector at 8K, main (the repo root as carried) against branch sched2
# (its changed files in .stage/sched2/overlay/), 3 runs of each mode, alternating main / sched2.
# Stage from a checkout of branch sched2 (here), then run on the device with carry [".stage/sched2"]:
#   mkdir -p .stage/sched2/wheels && cp benchmarks/results/issue16-sched2/run_device.sh .stage/sched2/
#   cp .stage/wheelsB/*.whl .stage/dynwheels/prometheus_client-*.whl .stage/sched2/wheels/
#   cp benchmarks/results/sched3/lockstep_ab.py .stage/sched2/   # run with no-finish, as these runs were
#   git diff --name-only main...sched2 -- semblend_dynamo trtllm_connector benchmarks/bench_connector.py \
#     | xargs -I{} cp --parents {} .stage/sched2/overlay/
# Then the paired A/B (lockstep_ab.py: both trees' schedulers in two processes, decisions alternating one by one).
#   command: bash .stage/sched2/run_device.sh
set -u
root=$PWD
runs=${RUNS:-3} requests=${REQUESTS:-2000}
python3 -c "import pydantic, xxhash, yaml, msgpack, prometheus_client, tqdm" 2>/dev/null \
  || python3 -m pip install -q --no-deps --target /tmp/site .stage/sched2/wheels/*.whl
for name in main sched2; do
  rm -rf /tmp/ab16/$name && mkdir -p /tmp/ab16/$name/.pp
  cp -r "$root"/semblend_dynamo "$root"/trtllm_connector "$root"/kernels "$root"/benchmarks /tmp/ab16/$name/
  ln -sfn /tmp/ab16/$name/kernels /tmp/ab16/$name/.pp/semblend_kernels
done
cp -r "$root"/.stage/sched2/overlay/. /tmp/ab16/sched2/
(cd /tmp/ab16 && diff -rq main sched2 | grep -v "^Only in\|\.pp" ) > "$OUT/diff_main_sched2.txt"
{ uptime; nproc; lscpu | grep -i "model name\|cache"; python3 -V; python3 -c "import numpy; print('numpy', numpy.__version__)"; } > "$OUT/host.txt" 2>&1
for run in $(seq 1 "$runs"); do
  for mode in exact shifted; do
    for name in main sched2; do
      (cd /tmp/ab16/$name && PYTHONPATH=/tmp/ab16/$name:/tmp/ab16/$name/.pp:/tmp/site timeout 240 \
        python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests "$requests" --mode $mode) \
        > "$OUT/${name}_${mode}_run${run}.txt" 2>&1
      echo "== $name $mode run $run"; grep "^| SemBlend" "$OUT/${name}_${mode}_run${run}.txt" | cut -c1-120
    done
  done
done
for mode in exact shifted; do
  PYTHONPATH=/tmp/ab16/main/.pp:/tmp/site timeout 240 python3 "$root"/.stage/sched2/lockstep_ab.py $mode 1000 \
    /tmp/ab16/main python3 /tmp/ab16/sched2 python3 no-finish > "$OUT/lockstep_$mode.txt" 2>&1
  cat "$OUT/lockstep_$mode.txt"
done
