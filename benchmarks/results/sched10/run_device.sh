#!/usr/bin/env bash
# Device (issue 16.2, sched10): on a quiet host, main (the baseline tree) against this tree, shifted and exact mode, in
# one call of about 6 minutes:
#   bash benchmarks/results/sched10/run_device.sh [ROUNDS]   (default 2 rounds)
#     1. decisions_ab.py (file mode) in both trees, then cmp: the same decisions and audit bytes;
#     2. bench_connector at 8K, shifted then exact, alternating base / this tree (the order swapped every other round),
#        ROUNDS rounds; summarize_ab.py;
#     3. where the span search goes in each tree (align_parts.py: the C call and the Python around it, per case).
# Every compiled part is built in place for the host's python3 in both trees (each build's status printed).
# Staging, in the checkout that carries this tree:
#   mkdir -p .stage/old && git archive <baseline commit> | xz > .stage/old/base.tar.xz
#   if the host's python3 has no headers, a copy of them (the prompt unboxing, the planner and the validation modules
#   are CPython extensions):
#   tar -cJf .stage/pyinc.tar.xz -C "$(dirname "$(python3.12 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')")" python3.12
#   .stage/fp/env.sh (optional): sourced first, e.g. session 12's benchmarks/results/session12/env.sh for the wheels.
#   command: bash benchmarks/results/sched10/run_device.sh 2, carry [".stage"]
# Leaves $OUT/sched10.tgz (every output file) and $OUT/summary.txt, and prints the tables.
set -uo pipefail
[ -f .stage/fp/env.sh ] && source .stage/fp/env.sh
rounds=${1:-2}
work=$(mktemp -d)
out=$work/out
base_tree=$work/base
mkdir -p "$out" "$base_tree" && tar -xJf .stage/old/base.tar.xz -C "$base_tree"
cp benchmarks/bench_connector.py "$base_tree/benchmarks/bench_connector.py"  # the same benchmark on both sides
base() { (cd "$base_tree" && PYTHONPATH=$base_tree:${PYTHONPATH:-} timeout 280 python3 "$@"); }
here() { PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 280 python3 "$@"; }  # this tree first, whatever env.sh put before it
cc_cmd=cc
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$inc/Python.h" ] && [ -f .stage/pyinc.tar.xz ]; then
  mkdir -p "$work/pyinc" && tar -xJf .stage/pyinc.tar.xz -C "$work/pyinc"
  cc_cmd="cc -I$work/pyinc/$(ls "$work/pyinc" | head -1)"
fi
for tree in base here; do
  $tree -m semblend_dynamo._native build > /dev/null 2>&1
  $tree -m semblend_dynamo._native status
  for m in trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation; do
    $tree -m $m build --cc "$cc_cmd" > /dev/null 2>&1
    $tree -m $m status
  done
done 2>&1 | tee "$out/native_status.txt"
{ uptime; nproc; lscpu | grep -i "model name"; python3 -V; git log --oneline -1; } 2>&1 | tee "$out/host.txt"

here benchmarks/results/sched4/decisions_ab.py 100 file > "$out/decisions_sched10.txt"
base "$PWD/benchmarks/results/sched4/decisions_ab.py" 100 file > "$out/decisions_base.txt"
if cmp -s "$out/decisions_base.txt" "$out/decisions_sched10.txt"; then echo "decisions_ab: identical"; else
  echo "decisions_ab: DIFFERENT"; fi | tee "$out/decisions_cmp.txt"
(cd "$out" && wc -l decisions_base.txt decisions_sched10.txt) | tee -a "$out/decisions_cmp.txt"
rm "$out/decisions_base.txt" "$out/decisions_sched10.txt"

for run in $(seq 1 "$rounds"); do
  order="base here"
  [ $((run % 2)) -eq 0 ] && order="here base"
  for mode in shifted exact; do
    args=(benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode $mode)
    for tree in $order; do
      name=$([ $tree = here ] && echo sched10 || echo base)
      $tree "${args[@]}" > "$out/${name}_${mode}_run$run.txt" 2>&1
      echo "$name $mode run $run: $(grep -E 'SemBlend' "$out/${name}_${mode}_run$run.txt" | cut -d'|' -f2,5,6 | tr '\n' ' ')"
    done
  done
done 2>&1 | tee "$out/rounds.txt"
python3 benchmarks/results/sched4/summarize_ab.py "$out" | tee "$out/summary.txt"

for case in miss shifted-hit; do
  base "$PWD/benchmarks/results/sched10/align_parts.py" 1000 $case base
  here benchmarks/results/sched10/align_parts.py 1000 $case sched10
done 2>&1 | tee "$out/align_parts.txt"
uptime | tee -a "$out/host.txt"
cp "$out/summary.txt" "$OUT/summary.txt"
tar -czf "$OUT/sched10.tgz" -C "$out" .
rm -rf "$work"
