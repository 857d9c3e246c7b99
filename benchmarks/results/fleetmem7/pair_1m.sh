source /work/wt/fleetmem7/env.sh
cd /tmp/fm7base && PYTHONPATH=/tmp/fm7base python benchmarks/bench_replica_sync.py --donors 1000000 --baseline-donors --timeout 1200 --sync-window 8 > /tmp/fm7_base2_1m.txt 2>&1
cd /work/wt/fleetmem7 && PYTHONPATH=/work/wt/fleetmem7 python benchmarks/bench_replica_sync.py --donors 1000000 --baseline-donors --timeout 1200 --sync-window 8 > /tmp/fm7_this3_1m.txt 2>&1
