# Session 21 on the quiet host: the connector's decision with the request's get_tokens as a list copy (the harness's
# default), as a zero-copy int32 view (what a binding exposing the vector as a buffer would give), and as
# TensorRT-LLM's binding makes it today (a new list of new ints), in turns, ROUNDS rounds. From the repo root with
# .stage (pkgs, fp, pyinc) carried:  bash benchmarks/results/session21/get_tokens.sh ROUNDS
rounds=${1:-2}
source .stage/fp/env.sh >/dev/null 2>&1 || true
lscpu | grep -E "Model name"; python3 -V
export PYTHONPATH=$PWD:/tmp/pr:/tmp/semdev/site
python3 -m trtllm_connector.unbox status
for r in $(seq "$rounds"); do
  for g in copy view convert; do
    echo "== round $r get_tokens $g"
    python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted --get-tokens $g | tail -5
  done
done
