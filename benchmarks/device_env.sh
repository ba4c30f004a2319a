# Sourced by benchmarks/run.sh and the suites it runs (benchmarks/suites/, fast_search_gpu.sh),
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
# the carried packages' bytecode, written once as pip would at install: the first search on a
# fresh host spent 7.8-8.6 s before spawning its workers (h200-determinism-2026-11-29/)
if [ ! -f /tmp/bt-pycache/.bt-site ]; then
    python3 -m compileall -q -j 0 /tmp/site > /dev/null 2>&1
    mkdir -p /tmp/bt-pycache && touch /tmp/bt-pycache/.bt-site
fi

# The searches outlive one 10-minute device command: a detached driver ($1/driver.sh, its log
# $1/driver.log, its pid $1/pid) runs them, and each command waits for it a while.
bt_running() { [ -f "$1/pid" ] && kill -0 "$(cat "$1/pid")" 2>/dev/null; }
# No driver running and none finished on this machine: the call must start one.
bt_needs_driver() { ! bt_running "$1" && ! grep -q "driver done" "$1/driver.log" 2>/dev/null; }
# The pin file of one of the grid suite's limits (benchmarks/tuner.py pin_file). $1: the limit.
bt_pin_file() {
    python3 -c "import sys; from benchmarks.tuner import pin_file; print(pin_file(sys.argv[1]))" "$1"
}
bt_start_driver() {  # $1: the state folder holding driver.sh
    setsid nohup bash "$1/driver.sh" >> "$1/driver.log" 2>&1 < /dev/null &
    echo $! > "$1/pid"
    echo "driver started, pid $(cat "$1/pid")"
}
bt_wait_driver() {  # $1: the state folder; $2: seconds at most
    local end=$((SECONDS + $2))
    while bt_running "$1" && [ $SECONDS -lt "$end" ]; do sleep 5; done
    if bt_running "$1"; then echo "driver still running"; else echo "driver not running"; fi
}
# A study database is in WAL mode: a plain copy misses what the WAL holds, so take a consistent
# snapshot through SQLite's backup API (safe while the search writes). $1: source, $2: copy.
bt_sqlite_copy() {
    python3 - "$1" "$2" <<'PY'
import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst)
dst.execute("PRAGMA journal_mode = DELETE")
dst.close()
PY
}
