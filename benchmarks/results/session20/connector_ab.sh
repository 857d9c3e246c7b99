# Session 20 on the quiet host: this tree against the session's starting main (the base tree, from
# .stage/old/base.patch), whole decisions in turns (session 18's connector_ab.sh) and each tree's slowest decisions
# step by step. From the repo root with .stage (pkgs, fp, old, pyinc) carried:
#   bash benchmarks/results/session20/connector_ab.sh ROUNDS
rounds=${1:-3}
source .stage/fp/env.sh >/dev/null 2>&1 || true
lscpu | grep -E "Model name|L2"; python3 -V
bash .stage/old/mkbase.sh >/dev/null && rm -rf /tmp/tree-base && mkdir -p /tmp/tree-base \
  && tar -xJf .stage/old/base.tar.xz -C /tmp/tree-base
bash benchmarks/results/session18/connector_ab.sh "$rounds"
for root in "$PWD" /tmp/tree-base; do
  for case in hit shifted-hit; do
    echo "== decide_steps $case, $([ "$root" = "$PWD" ] && echo this || echo base)"
    (cd "$root" && PYTHONPATH=$root:/tmp/pr:/tmp/semdev/site python3 benchmarks/results/sched4/decide_steps.py 2000 \
      shifted $case | tail -9)
  done
done
