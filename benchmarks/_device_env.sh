# Shared set-up of the GPU-machine scripts (device_check.sh, device_profile.sh); source it.
#
# A machine without torchrl & co. can get them as wheels in .whl/ (see the device tool's
# README); they are installed into /tmp/site first when that folder exists. Sets PYTHONPATH,
# PYTHONUNBUFFERED, CUBLAS_WORKSPACE_CONFIG and PY.
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
export CUBLAS_WORKSPACE_CONFIG=:4096:8 # deterministic cuBLAS (the tests ask for determinism)
PY=python3
