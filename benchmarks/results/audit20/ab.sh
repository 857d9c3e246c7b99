# ab.sh BASE [ROUNDS]: audit20 (this checkout) against main's audit module, from this checkout's root.
# BASE is a folder holding main's semblend_dynamo/audit.py (audit_ab.py loads only that file from it), e.g.
#   mkdir -p BASE/semblend_dynamo && git show 2f75de7:semblend_dynamo/audit.py >BASE/semblend_dynamo/audit.py
# Builds this tree's compiled modules for this Python, then:
#  1. append_pages.py: the audit's os.write alone, appends that start a new page of the file apart;
#  2. write_steps.py 1500 shifted hit: main's write, sub-step by sub-step, inside the decision;
#  3. audit_ab.py: this tree's AuditRecord/AuditWriter and the base's in turns per decision, ROUNDS rounds (default 3)
#     of shifted hits and of misses.
base=${1:?BASE: a folder holding the base semblend_dynamo/audit.py}
rounds=${2:-3}
for m in semblend_dynamo._native trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation semblend_dynamo.native_entries; do
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 -m $m build >/dev/null 2>&1 || echo "build $m failed"
done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
echo "== append_pages"; python3 benchmarks/results/audit20/append_pages.py
echo "== write_steps (main's write)"; python3 benchmarks/results/audit20/write_steps.py 1500 shifted hit
for case in hit miss; do
  echo "== audit_ab $case"; python3 benchmarks/results/audit20/audit_ab.py "$base" 2000 shifted $case "$rounds"
done
