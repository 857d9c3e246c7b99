#!/usr/bin/env bash
# frontend_ab.sh DONORS REQS ORDER...: the Frontend benchmark for each named tree in the given order, output in $OUT.
# A name is `this` (the checkout), `base` (.stage/old/base.tar.xz) or NAME (.stage/trees/NAME.tar.xz, a `git archive`).
# Every tree runs this checkout's benchmarks/frontend_path/run.py.
set -uo pipefail
source .stage/fp/env.sh
donors=$1; reqs=$2; shift 2
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; } | tee -a "$OUT/host.txt"
i=0
for t in "$@"; do
  i=$((i + 1)); root=$PWD
  if [ "$t" != this ]; then
    tarball=$([ "$t" = base ] && echo .stage/old/base.tar.xz || echo ".stage/trees/$t.tar.xz")
    root=/tmp/tree-$t && rm -rf "$root" && mkdir -p "$root" && tar -xJf "$tarball" -C "$root"
    cp benchmarks/frontend_path/run.py "$root/benchmarks/frontend_path/run.py"
    (cd "$root" && PYTHONPATH=/tmp/semdev/site:/tmp/pr:$root python3 -m semblend_dynamo._native build >/dev/null 2>&1)
  fi
  (cd "$root" && PYTHONPATH=/tmp/semdev/site:/tmp/pr:$root timeout 280 python3 -m benchmarks.frontend_path.run \
    --donors "$donors" --requests "$reqs") > "$OUT/frontend_${i}_$t.txt" 2>&1
  echo "== $t rc=$? $(uptime)"; grep -E "total_added|decide|spans\`|exact\`|semantic\`|hint\`|over 5 ms" "$OUT/frontend_${i}_$t.txt"
done
