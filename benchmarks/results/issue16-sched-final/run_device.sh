#!/usr/bin/env bash
# Device: bench_connector at 8K, the session's start (232d7d8) against this tree (native aligner built here), both
# with this tree's bench_connector.py, alternating. Args: runs (default 2).
set -uo pipefail
source .stage/fp/env.sh
runs=${1:-2}
rm -rf /tmp/old && mkdir -p /tmp/old/.pp && tar -xJf .stage/old/tree232.tar.xz -C /tmp/old && ln -sfn /tmp/old/kernels /tmp/old/.pp/semblend_kernels
cp benchmarks/bench_connector.py /tmp/old/benchmarks/bench_connector.py
python3 -m semblend_dynamo._native build 2>&1 | tail -1; python3 -m semblend_dynamo._native status
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee $OUT/host.txt
for run in $(seq 1 $runs); do
  for mode in exact shifted; do
    (cd /tmp/old && PYTHONPATH=/tmp/old:/tmp/old/.pp:/tmp/semdev/site timeout 200 python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode) > $OUT/start_${mode}_run$run.txt 2>&1
    timeout 200 python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode > $OUT/final_${mode}_run$run.txt 2>&1
    for t in start final; do echo "== $t $mode run$run"; grep "^| " $OUT/${t}_${mode}_run$run.txt | grep -v "^| ---\|^|---" | cut -c1-150; done
  done
done
