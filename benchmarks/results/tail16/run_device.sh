#!/usr/bin/env bash
# Device (issue 16.2, tail16): what makes the shifted-mode hits' p99 ~1.8x their p50 on a quiet host, in one call of
# ~6-7 minutes:
#   bash benchmarks/results/tail16/run_device.sh [ROUNDS]   (default 3)
#     1. decisions_ab.py (file mode) in both trees, then cmp: the same decisions and audit bytes;
#     2. bench_connector at 8K in shifted mode, alternating base / this tree (the order swapped every other round),
#        ROUNDS rounds, then one round of exact mode; summarize_ab.py (whole-decision p50 / p99 / CPU p99 per case);
#     3. tail_probe.py in both trees (shifted, 2,000 requests a case): per decision the page faults, context
#        switches, collections, heap changes, CPU moves and a canary timed next to it, the slowest 2% against the rest;
#     4. step_tail.py in this tree (shifted hit and hit, 1,200 prompts decided twice): which sub-step grows in the
#        slowest 2%, and whether the same prompts are slow again on the second pass;
#     5. bench_connector shifted once per tree pinned to one CPU (taskset), and here once with the audit in memory and
#        once with numpy's AVX-512 kernels disabled (NPY_DISABLE_CPU_FEATURES; the names this numpy accepts): whether
#        the tail moves with the scheduler's placement, the audit file's writes or AVX-512 frequency changes.
# Every compiled part is built in place for the host's python3 in both trees (each build's status printed).
# Staging: .stage/old/base.tar.xz = `git archive main | xz`, .stage/pyinc.tar.xz if the host's python3 has no headers,
# .stage/fp/env.sh optional; carry [".stage"]. The probes are copied into the base tree (the same scripts both sides).
# Leaves $OUT/tail16.tgz (every output file) and $OUT/summary.txt, and prints the tables.
set -uo pipefail
[ -f .stage/fp/env.sh ] && source .stage/fp/env.sh
rounds=${1:-3}
work=$(mktemp -d)
out=$work/out
base_tree=$work/base
mkdir -p "$out" "$base_tree" && tar -xJf .stage/old/base.tar.xz -C "$base_tree"
cp benchmarks/bench_connector.py "$base_tree/benchmarks/bench_connector.py"  # the same benchmark on both sides
mkdir -p "$base_tree/benchmarks/results/tail16"
cp benchmarks/results/tail16/*.py "$base_tree/benchmarks/results/tail16/"
base() { (cd "$base_tree" && PYTHONPATH=$base_tree:${PYTHONPATH:-} timeout 200 python3 "$@"); }
here() { PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 200 python3 "$@"; }
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
{ uptime; nproc; lscpu | grep -E "Model name|^NUMA node|Thread\(s\) per core|Hypervisor vendor"; python3 -V; git log --oneline -1; } 2>&1 | tee "$out/host.txt"

here benchmarks/results/sched4/decisions_ab.py 100 file > "$out/decisions_tail16.txt"
base "$PWD/benchmarks/results/sched4/decisions_ab.py" 100 file > "$out/decisions_base.txt"
if cmp -s "$out/decisions_base.txt" "$out/decisions_tail16.txt"; then echo "decisions_ab: identical"; else
  echo "decisions_ab: DIFFERENT"; fi | tee "$out/decisions_cmp.txt"
(cd "$out" && wc -l decisions_base.txt decisions_tail16.txt) | tee -a "$out/decisions_cmp.txt"
rm "$out/decisions_base.txt" "$out/decisions_tail16.txt"

bench() {  # tree mode run [extra bench_connector arguments]
  local name=$([ "$1" = here ] && echo tail16 || echo base) tree=$1 mode=$2 run=$3
  shift 3
  $tree benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode "$mode" "$@" \
    > "$out/${name}_${mode}_run${run}.txt" 2>&1
  echo "$name $mode run $run: $(grep -E 'SemBlend' "$out/${name}_${mode}_run${run}.txt" | cut -d'|' -f2,5,6 | tr '\n' ' ')"
}
for run in $(seq 1 "$rounds"); do
  order="base here"
  [ $((run % 2)) -eq 0 ] && order="here base"
  for tree in $order; do bench $tree shifted "$run"; done
done 2>&1 | tee "$out/rounds.txt"
for tree in here base; do bench $tree exact 1; done 2>&1 | tee -a "$out/rounds.txt"
python3 benchmarks/results/sched4/summarize_ab.py "$out" | tee "$out/summary.txt"

for tree in base here; do
  echo "== tail_probe, $tree"
  $tree benchmarks/results/tail16/tail_probe.py --requests 2000 --dump "$out/probe_$tree.tsv"
done 2>&1 | tee "$out/tail_probe.txt" | tee -a "$out/summary.txt"
for case in shifted-hit hit; do
  here benchmarks/results/tail16/step_tail.py 1200 shifted $case 2
done 2>&1 | tee "$out/step_tail.txt" | tee -a "$out/summary.txt"

cpu=$(( $(nproc) / 2 ))
mkdir -p "$out/variants"
for tree in base here; do
  name=$([ "$tree" = here ] && echo tail16 || echo base)
  (cd "$([ "$tree" = here ] && echo "$PWD" || echo "$base_tree")" && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 200 \
    taskset -c "$cpu" python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted) \
    > "$out/variants/${name}_pinned_cpu${cpu}.txt" 2>&1
done
here benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted --audit memory \
  > "$out/variants/tail16_audit_memory.txt" 2>&1
for npy_off in "X86_V4 AVX512_ICL AVX512_SPR" "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"; do
  NPY_DISABLE_CPU_FEATURES="$npy_off" python3 -c "import numpy" > /dev/null 2>&1 && break
done
{ echo "NPY_DISABLE_CPU_FEATURES=$npy_off"
  NPY_DISABLE_CPU_FEATURES="$npy_off" python3 -c "import numpy; numpy.show_runtime()" 2>&1 | grep -A4 simd
} > "$out/npy_avx512_off.txt"
NPY_DISABLE_CPU_FEATURES="$npy_off" here benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 \
  --mode shifted > "$out/variants/tail16_numpy_avx512_off.txt" 2>&1
for f in "$out"/variants/*.txt; do
  echo "$(basename "$f" .txt): $(grep -E 'SemBlend' "$f" | cut -d'|' -f2,5,6,8 | tr '\n' ' ')"
done 2>&1 | tee "$out/variants.txt" | tee -a "$out/summary.txt"
uptime | tee -a "$out/host.txt"
cp "$out/summary.txt" "$OUT/summary.txt"
tar -czf "$OUT/tail16.tgz" -C "$out" .
rm -rf "$work"
