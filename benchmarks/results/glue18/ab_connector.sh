# glue18's A/B on the development VM: bench_connector (8K prompts, shifted) alternating the base tree and this one,
# on Python 3.11 and 3.12, ROUNDS rounds. Usage: bash ab_connector.sh BASE_TREE THIS_TREE PY311 PY312 [ROUNDS]
# Each tree needs its native modules built for both Pythons, and semblend_kernels importable (PR_<tree> folders).
base=$1 this=$2 p311=$3 p312=$4 rounds=${5:-3}
for r in $(seq 1 "$rounds"); do
  for py in "$p311" "$p312"; do
    v=$($py -c "import sys; print('%d.%d' % sys.version_info[:2])")
    for tree in "$base" "$this"; do
      echo "== round $r, python $v, $tree"
      (cd "$tree" && PYTHONPATH=$tree:${PR:-} $py benchmarks/bench_connector.py --prompt-tokens 8192 --requests 600 \
        --mode shifted | grep -E "^\| (no-op|SemBlend)")
    done
  done
done
