# VM stand-in for the device staging: the checkout's venv, this tree on the path, the native aligner built.
export PATH=$PWD/.venv/bin:$PATH
export PYTHONPATH=$PWD
python3 -m semblend_dynamo._native build >/dev/null && python3 -m semblend_dynamo._native status
