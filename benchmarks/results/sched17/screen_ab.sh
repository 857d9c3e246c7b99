#!/usr/bin/env bash
# Device (issue 16.2, sched17): the span screen rolling the mixed hash (screen_mixroll.patch, not merged) against the
# checkout's screen, on a quiet host, ~2 minutes:
#   bash benchmarks/results/sched17/screen_ab.sh [ROUNDS]   (default 4)
# The patched tree is a copy of the checkout with the patch applied; the span aligner and the other compiled parts are
# built in place in both (the host's python3; .stage/pyinc.tar.xz for headers where it has none, as tail16's script).
# Then: decisions_ab.py (file mode) in both, cmp; align_in_flow.py (miss, hit, shifted hit; 1,200 decisions each) in
# rounds alternating the trees, the order swapped every other round. Prints `sa_align` / `_find_spans` medians per
# round; leaves every output under $OUT (or a temporary folder).
set -uo pipefail
[ -f .stage/fp/env.sh ] && source .stage/fp/env.sh
rounds=${1:-4}
work=$(mktemp -d)
out=${OUT:-$work/out}
mkdir -p "$out" "$work/patched"
git ls-files -z | xargs -0 tar -cf - | tar -xf - -C "$work/patched"
(cd "$work/patched" && patch -s -p1 < "$OLDPWD/benchmarks/results/sched17/screen_mixroll.patch") || exit 1
base() { PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 200 python3 "$@"; }
patched() { (cd "$work/patched" && PYTHONPATH=$work/patched:${PYTHONPATH:-} timeout 200 python3 "$@"); }
cc_cmd=cc
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$inc/Python.h" ] && [ -f .stage/pyinc.tar.xz ]; then
  mkdir -p "$work/pyinc" && tar -xJf .stage/pyinc.tar.xz -C "$work/pyinc"
  cc_cmd="cc -I$work/pyinc/$(ls "$work/pyinc" | head -1)"
fi
for tree in base patched; do
  $tree -m semblend_dynamo._native build > /dev/null 2>&1
  $tree -m semblend_dynamo._native status
  for m in trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation; do
    $tree -m $m build --cc "$cc_cmd" > /dev/null 2>&1
    $tree -m $m status
  done
done 2>&1 | tee "$out/native_status.txt"
{ uptime; nproc; lscpu | grep -E "Model name|Hypervisor vendor"; python3 -V; git log --oneline -1; } 2>&1 | tee "$out/host.txt"
for tree in base patched; do $tree "$PWD/benchmarks/results/sched4/decisions_ab.py" 100 file > "$out/decisions_$tree.txt"; done
if cmp -s "$out/decisions_base.txt" "$out/decisions_patched.txt"; then echo "decisions_ab: identical"; else
  echo "decisions_ab: DIFFERENT"; fi | tee "$out/decisions_cmp.txt"
wc -l "$out/decisions_base.txt" | tee -a "$out/decisions_cmp.txt"
for run in $(seq 1 "$rounds"); do
  order="base patched"
  [ $((run % 2)) -eq 0 ] && order="patched base"
  for tree in $order; do
    for case in miss hit shifted-hit; do
      $tree "$PWD/benchmarks/results/sched17/align_in_flow.py" 1200 shifted $case > "$out/${tree}_${case}_run$run.txt" 2>&1
      echo "$tree $case run $run: $(grep -E 'sa_align|_find_spans' "$out/${tree}_${case}_run$run.txt" | tr -s ' ' | tr '\n' ' ')"
    done
  done
done 2>&1 | tee "$out/rounds.txt"
