#!/usr/bin/env bash
# Issue 16.2 (simd21): the AVX-512 screen on a host CPU that has it, against main, ~3-4 minutes:
#   bash benchmarks/results/simd21/host_check.sh [BASE_TREE]   (default /tmp/base-tree: main's tree, built or not)
# The tree it runs from has avx512_screen.patch applied (git apply benchmarks/results/simd21/avx512_screen.patch, on acd99c4).
# From this checkout's root. Both trees' compiled parts are built in place (python3 on PATH; .stage/pyinc.tar.xz for
# the headers where it has none). Then, this tree:
#  1. which screen the library picks (SEMBLEND_ALIGNER_SIMD unset, 1 and 0) and the CPU's avx512 flags;
#  2. the aligner tests (tests/core/test_native_aligner*.py, test_span_aligner*.py, test_chunk_filter.py; the first
#     holds test_native_aligner_simd.py: the AVX-512 screen's rows against the portable one's) with the AVX-512 screen
#     on, then off;
#  3. decisions_digest.py 2000 200 with it on and off: both must print 0a3cdb2445e3d23df401c2de;
#  4. screen_bench.py: the screen alone (portable, and AVX-512), one process;
#  5. search_ab.py: this tree's sa_align against the base's in one process, warm (miss, hit, shifted hit), on, then off
#     (off: this tree's portable screen against main's, the dispatch's cost);
#  6. dec19/align_ab.py: whole decisions alternating this tree's and the base's sa_align (miss, hit, shifted hit,
#     2,000 decisions each; decision and _find_spans p50 / p90 / p99), the AVX-512 screen on.
# Everything goes to $OUT (or a temporary folder); summary.txt holds the lines that matter.
set -uo pipefail
[ -f .stage/fp/env.sh ] && source .stage/fp/env.sh
base_tree=$(cd "${1:-/tmp/base-tree}" && pwd) || exit 1
work=$(mktemp -d)
out=${OUT:-$work/out}
mkdir -p "$out"
here=$PWD
new() { PYTHONPATH=$here:${PYTHONPATH:-} timeout 300 python3 "$@"; }
base() { (cd "$base_tree" && PYTHONPATH=$base_tree:${PYTHONPATH:-} timeout 300 python3 "$@"); }
cc_cmd=cc
inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$inc/Python.h" ] && [ -f .stage/pyinc.tar.xz ]; then
  mkdir -p "$work/pyinc" && tar -xJf .stage/pyinc.tar.xz -C "$work/pyinc"
  cc_cmd="cc -I$work/pyinc/$(ls "$work/pyinc" | head -1)"
fi
{
  echo "== host"
  lscpu | grep -E "Model name|^CPU\(s\)|Hypervisor vendor"
  echo "avx512 flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep avx512 | tr '\n' ' ')"
  python3 -V; cc --version | head -1; git log --oneline -1
  echo "== build"
  for tree in base new; do
    $tree -m semblend_dynamo._native build > /dev/null 2>&1 || echo "$tree: library build failed"
    for m in trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation \
      semblend_dynamo.native_entries; do
      $tree -m $m build --cc "$cc_cmd" > /dev/null 2>&1 || echo "$tree: $m build failed"
    done
    echo "$tree: $($tree -m semblend_dynamo._native status 2>&1 | tail -1)"
  done
  for simd in "" 1 0; do
    echo "SEMBLEND_ALIGNER_SIMD=${simd:-(unset)}: $(SEMBLEND_ALIGNER_SIMD=$simd new -c \
      'from semblend_dynamo import _native as n; print("SIMD", n.SIMD, "-", n.REASON)' 2>&1 | tail -1)"
  done
  echo "== tests"
  tests="tests/core/test_native_aligner.py tests/core/test_native_aligner_equivalence.py
    tests/core/test_native_aligner_simd.py tests/core/test_span_aligner.py tests/core/test_span_aligner_reference.py
    tests/core/test_chunk_filter.py"
  for simd in 1 0; do
    SEMBLEND_ALIGNER_SIMD=$simd new -m pytest -q -p no:cacheprovider $tests > "$out/tests_simd$simd.txt" 2>&1
    echo "tests, SEMBLEND_ALIGNER_SIMD=$simd: $(tail -1 "$out/tests_simd$simd.txt")"
  done
  echo "== digest (want 0a3cdb2445e3d23df401c2de)"
  for simd in 1 0; do
    echo "SEMBLEND_ALIGNER_SIMD=$simd: $(SEMBLEND_ALIGNER_SIMD=$simd new benchmarks/results/spans15/decisions_digest.py . \
      2000 200 2>&1 | tail -1)"
  done
  echo "== the screen alone (8K tokens, anchor 32)"
  new benchmarks/results/simd21/screen_bench.py 3000 2>&1
  echo "== the search, warm, against $base_tree"
  for simd in 1 0; do
    echo "SEMBLEND_ALIGNER_SIMD=$simd"
    SEMBLEND_ALIGNER_SIMD=$simd new benchmarks/results/simd21/search_ab.py "$base_tree" 64 40 2>&1
  done
  echo "== whole decisions, alternating this tree's sa_align (AVX-512 screen on) and the base's"
  for case in miss hit shifted-hit; do
    SEMBLEND_ALIGNER_SIMD=1 new benchmarks/results/dec19/align_ab.py "$base_tree" 2000 $case 2>&1
  done
  echo "== failed tests, if any"
  grep -hE "^(FAILED|ERROR)" "$out"/tests_simd*.txt | head -20
} 2>&1 | tee "$out/summary.txt"
echo "outputs: $out"
