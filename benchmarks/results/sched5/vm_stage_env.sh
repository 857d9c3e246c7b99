# VM stand-in for the device staging: the main venv, this tree on the path, the native aligner built.
export PATH=/work/main/.venv/bin:$PATH
export PYTHONPATH=$PWD
python3 -m semblend_dynamo._native build >/dev/null && python3 -m semblend_dynamo._native status
