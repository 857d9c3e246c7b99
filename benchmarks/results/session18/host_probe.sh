# Session 18: what makes the connector's decisions 2-3x slower on the H200 host than on the development VM.
# From the repo root, with .stage (pkgs, fp, pyinc) carried: bash benchmarks/results/session18/host_probe.sh
source .stage/fp/env.sh >/dev/null 2>&1 || true
lscpu | grep -E "Model name|^CPU\(s\)|MHz|L2|L3|NUMA|Thread" ; python3 -V
grep -E "AnonHugePages|Hugepagesize" /proc/meminfo; cat /sys/kernel/mm/transparent_hugepage/enabled
echo "== pure Python"
python3 -m timeit -n 300 -r 7 "sum(i * i for i in range(10000))"
python3 -m timeit -n 300 -r 7 "d = {}" "for i in range(5000): d[i] = i"
echo "== dependent-load latency"
cc -O2 -o /tmp/memlat benchmarks/results/session18/memlat.c
for s in 262144 4194304 33554432 268435456; do /tmp/memlat $s 64; done
for s in 4194304 33554432 268435456 1073741824; do /tmp/memlat $s 4096; done
echo "== decision steps (hit, shifted hit)"
python3 benchmarks/results/sched4/decide_steps.py 1500 shifted hit | tail -12
python3 benchmarks/results/sched17/align_in_flow.py 1200 shifted hit
python3 benchmarks/results/sched17/align_in_flow.py 1200 shifted miss
echo "== bench_connector, free and pinned to one CPU"
for r in 1 2; do
  python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted | tail -5
  taskset -c 5 python3 benchmarks/bench_connector.py --prompt-tokens 8192 --requests 2000 --mode shifted | tail -5
done
