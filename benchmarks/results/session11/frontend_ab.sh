#!/usr/bin/env bash
# frontend_ab.sh DONORS REQS ORDER...: the Frontend benchmark (spans during exact on), base tree (.stage/old) and this
# tree in the given order (base|this|this-gil-off), output in $OUT
set -uo pipefail
source .stage/fp/env.sh
donors=$1; reqs=$2; shift 2
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xJf .stage/old/base.tar.xz -C /tmp/base
cp benchmarks/frontend_path/run.py /tmp/base/benchmarks/frontend_path/run.py
sed -i '/"SEMBLEND_ALIGNER_RELEASE_GIL"/d' /tmp/base/benchmarks/frontend_path/run.py
(cd /tmp/base && PYTHONPATH=/tmp/semdev/site:/tmp/pr:/tmp/base python3 -m semblend_dynamo._native build >/dev/null 2>&1; PYTHONPATH=/tmp/semdev/site:/tmp/pr:/tmp/base python3 -m semblend_dynamo._native status)
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee -a $OUT/host.txt
for t in "$@"; do
  case $t in
    base) (cd /tmp/base && PYTHONPATH=/tmp/semdev/site:/tmp/pr:/tmp/base timeout 280 python3 -m benchmarks.frontend_path.run --donors $donors --requests $reqs) > $OUT/frontend_$t.txt 2>&1 ;;
    this) timeout 280 python3 -m benchmarks.frontend_path.run --donors $donors --requests $reqs > $OUT/frontend_$t.txt 2>&1 ;;
    this-sw*) timeout 280 python3 -m benchmarks.frontend_path.run --donors $donors --requests $reqs --gil-switch-interval-ms ${t#this-sw} > $OUT/frontend_$t.txt 2>&1 ;;
    this-gil-off) timeout 280 python3 -m benchmarks.frontend_path.run --donors $donors --requests $reqs --aligner-release-gil off > $OUT/frontend_$t.txt 2>&1 ;;
  esac
  echo "== $t rc=$? $(uptime)"; grep -E "sequential, span|total_added|decide|spans\`|exact\`|semantic\`|hint\`|over 5 ms" $OUT/frontend_$t.txt
done
