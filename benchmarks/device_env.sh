# Sourced by the device scripts (tuner_gpu.sh, wall_gpu.sh, sharded_gpu.sh and their drivers),
# from the repository root: the carried wheels (.whl: the project and the dependencies the
# hosts lack, shared/device-wheels/README.md) installed once per machine into /tmp/site, and
# a bytecode cache as a normal install has. The device hosts set PYTHONDONTWRITEBYTECODE=1 and
# torch's install holds no .pyc files, so every trial process compiled torch's Python anew
# (~11 s of imports; h200-fresh-run-cost-2026-11-25/): give them a cache in /tmp.
if [ ! -f /tmp/site/.bt-installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || return 1
    touch /tmp/site/.bt-installed
fi
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH=/tmp/site PYTHONPYCACHEPREFIX=/tmp/bt-pycache
