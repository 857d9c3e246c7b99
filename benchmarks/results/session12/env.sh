# Device staging for session 12's quiet-host runs (sourced from the repo root; copy to .stage/fp/env.sh).
# Installs the carried py3.12 wheels into /tmp/semdev/site (every .stage/whl*/ present), unpacks Dynamo
# (.stage/dynA: dynamo-py.tar.xz, core.so.xz, nats-server.xz) when carried, and builds this tree's compiled parts.
S=/tmp/semdev/site
mkdir -p "$S" /tmp/semdev/bin
if [ ! -f /tmp/semdev/.done ]; then
  whl=$(ls .stage/whl*/*.whl 2>/dev/null)
  [ -n "$whl" ] && python3 -m pip install -q --no-deps --no-index --target "$S" $whl 2>&1 | tail -1
  if [ -f .stage/dynA/dynamo-py.tar.xz ]; then
    tar -xJf .stage/dynA/dynamo-py.tar.xz -C "$S"
    xz -dc .stage/dynA/core.so.xz > "$S/dynamo/_core.abi3.so"
  fi
  [ -f .stage/dynA/nats-server.xz ] && xz -dc .stage/dynA/nats-server.xz > /tmp/semdev/bin/nats-server \
    && chmod +x /tmp/semdev/bin/nats-server
  touch /tmp/semdev/.done
fi
export PATH=/tmp/semdev/bin:$PATH:/usr/sbin
mkdir -p /tmp/pr && ln -sfn "$PWD/kernels" /tmp/pr/semblend_kernels  # the kernels' import name, as installed
export PYTHONPATH=$PWD:/tmp/pr:$S
cc_inc=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if [ ! -f "$cc_inc/Python.h" ] && [ -f .stage/pyinc.tar.xz ]; then
  mkdir -p /tmp/pyinc && tar -xJf .stage/pyinc.tar.xz -C /tmp/pyinc
  export SEMBLEND_CC="cc -I/tmp/pyinc/python3.12"
fi
for m in semblend_dynamo._native trtllm_connector.unbox semblend_dynamo.native_planner trtllm_connector.native_validation; do
  if [ -n "${SEMBLEND_CC:-}" ] && [ "$m" != semblend_dynamo._native ]; then
    python3 -m $m build --cc "$SEMBLEND_CC" > /dev/null 2>&1 || echo "build $m failed"
  else
    python3 -m $m build > /dev/null 2>&1 || echo "build $m failed"
  fi
done
