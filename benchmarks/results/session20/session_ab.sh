# Session 20 on the quiet host: session_ab.py (this tree against the session's starting main, the tree chosen per
# decision in one process) for hit, shifted hit and miss, ROUNDS rounds, and an A/A round. From the repo root with
# .stage (pkgs, fp, old, pyinc) carried: bash benchmarks/results/session20/session_ab.sh ROUNDS
rounds=${1:-2}
source .stage/fp/env.sh >/dev/null 2>&1 || true
lscpu | grep -E "Model name"; python3 -V
bash .stage/old/mkbase.sh >/dev/null && rm -rf /tmp/tree-base && mkdir -p /tmp/tree-base \
  && tar -xJf .stage/old/base.tar.xz -C /tmp/tree-base
python3 -m semblend_dynamo.native_entries build >/dev/null 2>&1 || echo "build native_entries failed"
export PYTHONPATH=$PWD:/tmp/pr:/tmp/semdev/site
for r in $(seq "$rounds"); do
  for case in hit shifted-hit miss; do
    echo "== round $r $case"
    python3 benchmarks/results/session20/session_ab.py /tmp/tree-base 2400 $case | tail -3
  done
done
echo "== A/A hit"
python3 benchmarks/results/session20/session_ab.py . 2400 hit | tail -3
