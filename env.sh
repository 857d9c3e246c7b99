export PATH=/work/main/.venv/bin:$PATH:/usr/sbin
export PYTHONPATH=/work/wt/fleetmem5/.pyroot:/work/wt/fleetmem5
cd /work/wt/fleetmem5
