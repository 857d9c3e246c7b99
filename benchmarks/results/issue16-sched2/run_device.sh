#!/bin/bash
# Issue 16.2 (sched2), one device call: bench_connector at 8K, main (the repo root as carried) against branch sched2
# (its changed files in .stage/sched2/overlay/), 3 runs of each mode, alternating main / sched2.
# Stage from a checkout of branch sched2 (here), then run on the device with carry [".stage/sched2"]:
#   mkdir -p /work/main/.stage/sched2 && cp benchmarks/results/issue16-sched2/run_device.sh /work/main/.stage/sched2/
#   git diff --name-only main -- semblend_dynamo trtllm_connector benchmarks/bench_connector.py \
#     | xargs -I{} cp --parents {} /work/main/.stage/sched2/overlay/
#   command: bash .stage/sched2/run_device.sh
set -u
root=$PWD
python3 -c "import pydantic, xxhash, yaml, msgpack" 2>/dev/null || pip install -q --no-deps --target /tmp/site .stage/wheelsB/*.whl
python3 -c "import prometheus_client" 2>/dev/null || pip install -q --no-deps --target /tmp/site .stage/dynwheels/prometheus_client-*.whl
for name in main sched2; do
  rm -rf /tmp/$name && mkdir -p /tmp/$name/.pp
  cp -r "$root"/semblend_dynamo "$root"/trtllm_connector "$root"/kernels "$root"/benchmarks /tmp/$name/
  ln -sfn /tmp/$name/kernels /tmp/$name/.pp/semblend_kernels
done
cp -r "$root"/.stage/sched2/overlay/. /tmp/sched2/
(cd /tmp && diff -rq main sched2 | grep -v "^Only in\|\.pp" ) > "$OUT/diff_main_sched2.txt"
{ uptime; nproc; lscpu | grep -i "model name\|cache"; python3 -V; python3 -c "import numpy; print('numpy', numpy.__version__)"; } > "$OUT/host.txt" 2>&1
for run in 1 2 3; do
  for mode in exact shifted; do
    for name in main sched2; do
      (cd /tmp/$name && PYTHONPATH=/tmp/$name:/tmp/$name/.pp:/tmp/site timeout 240 \
        python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode) \
        > "$OUT/${name}_${mode}_run${run}.txt" 2>&1
      echo "== $name $mode run $run"; grep "^| SemBlend" "$OUT/${name}_${mode}_run${run}.txt" | cut -c1-120
    done
  done
done
