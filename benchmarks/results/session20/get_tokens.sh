# Session 20 on the quiet host: the connector's decision with the request's get_tokens as a list copy (the harness's
# default, every earlier figure) and as TensorRT-LLM's binding makes it (a new list of new ints from an int32 vector),
# in turns, ROUNDS rounds. From the repo root with .stage (pkgs, fp, pyinc) carried:
#   bash benchmarks/results/session20/get_tokens.sh ROUNDS
rounds=${1:-2}
source .stage/fp/env.sh >/dev/null 2>&1 || true
lscpu | grep -E "Model name"; python3 -V
export PYTHONPATH=$PWD:/tmp/pr:/tmp/semdev/site
for r in $(seq "$rounds"); do
  for g in copy convert; do
    echo "== round $r get_tokens $g"
    python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted --get-tokens $g | tail -5
  done
done
