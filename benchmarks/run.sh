#!/usr/bin/env bash
# The one way to run a benchmark suite on a GPU host (docs/benchmarks.md):
#
#   bash benchmarks/run.sh SUITE WAIT_S [ARGS...]     (device, .whl carried; results in $OUT/SUITE/)
#   bash benchmarks/run.sh --list                      (anywhere: the suites, one line each)
#
# A device command lasts at most 10 minutes and the suites run longer, so every suite runs as a
# detached driver: the first call installs the carried wheels (benchmarks/device_env.sh, once
# per machine), copies benchmarks/, studies/ and examples/ into /tmp/bt-SUITE/src (a later call
# re-sends the working tree; the running driver keeps the code it started with) and starts
# `bash benchmarks/suites/SUITE.sh ARGS...` there, with BT_STATE=/tmp/bt-SUITE and
# BT_OUT=/tmp/bt-SUITE/out, where the suite writes everything it makes. Every call then waits
# up to WAIT_S seconds for the driver and brings back what exists: $OUT/SUITE/SUITE.tar (out/,
# its SQLite studies copied through SQLite's backup API, the driver's log and the trial
# workers' logs) and $OUT/SUITE/driver.log. A call that finds the driver running waits on it;
# one that finds it finished with the same ARGS only brings its results back; other ARGS start
# a new driver in the same state folder (out/ kept: the suites resume from what it holds). The
# last line says "driver done" or "driver still running": call again at once, the driver lives
# only while the machine is held.
#
# The search suite is benchmarks/fast_search_gpu.sh, run as it is (its state in /tmp/bt-fast,
# its archive $OUT/search/fast.tar).
set -euo pipefail

# name | what it reproduces (one line each; docs/benchmarks.md has the figures and commands)
SUITES="search|issue 44: search walls from the command to the pin, phase tables, pins head to head and in cold jobs (PHASE...)
grid|issues 10 and 30: the built-in Llama's limits searched against its grids, the wall of a search as written, hand grids against searches of transformers models (STEP...)
job|issues 28 and 32: every committed pin applied in a fresh training job, and through a transformers Trainer (STEP...)
families|issues 9, 15, 28 and 45: transformers families through hf:, sharded searches under torchrun and their pins in jobs (STEP...)
offload|issue 33: offload searched with recompute on the built-in Llama, the pins in jobs, the offload probe ([BATCH] [TRIALS])
workers|issue 4: one study run by two GPU workers, then by one, and the trials per hour of each
cost|issue 10: where a fresh trial process's wall time goes (imports, bytecode cache, compile caches)"

usage() { echo "usage: bash benchmarks/run.sh SUITE WAIT_S [ARGS...] | --list" >&2; exit 2; }

if [ "${1:-}" = --list ]; then
    while IFS='|' read -r name what; do printf '%-9s %s\n' "$name" "$what"; done <<< "$SUITES"
    exit 0
fi
[ $# -ge 1 ] || usage
suite=$1
if [[ ! $suite =~ ^[a-z]+$ ]] || ! grep -q "^$suite|" <<< "$SUITES"; then
    echo "run.sh: unknown suite '$suite' (bash benchmarks/run.sh --list names them)" >&2
    exit 2
fi
[ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || usage
wait_s=$2
shift 2
: "${OUT:?run.sh runs on the device host, where \$OUT is the folder that comes back}"
mkdir -p "$OUT/$suite"

if [ "$suite" = search ]; then  # its own driver, unchanged (docs/benchmarks.md)
    rc=0
    OUT=$OUT/search bash benchmarks/fast_search_gpu.sh "$wait_s" "$@" || rc=$?
    source benchmarks/device_env.sh
    if bt_running /tmp/bt-fast; then echo "run.sh: search driver still running"
    else echo "run.sh: search driver done (exit $rc)"; fi
    exit "$rc"
fi

source benchmarks/device_env.sh  # the wheels, PYTHONPATH, and bt_running/bt_start_driver/...
state=${BT_STATE_ROOT:-/tmp}/bt-$suite  # BT_STATE_ROOT: the tests' own folder
export BT_STATE=$state BT_OUT=$state/out
mkdir -p "$BT_OUT"
args="$*"
if bt_running "$state"; then
    echo "run.sh: $suite driver running ($(cat "$state/args" 2>/dev/null)): waiting on it"
elif grep -q "== driver done" "$state/driver.log" 2>/dev/null \
    && [ "$(cat "$state/args" 2>/dev/null)" = "$args" ]; then
    echo "run.sh: $suite driver done before with these arguments: bringing its results back"
else
    # an earlier driver's log (other arguments, or cut off with the machine) stays beside out/
    [ -f "$state/driver.log" ] && cat "$state/driver.log" >> "$BT_OUT/driver-earlier.log"
    rm -f "$state/driver.log"
    rm -rf "$state/src" && mkdir -p "$state/src"
    for d in benchmarks studies examples; do [ -d "$d" ] && cp -r "$d" "$state/src/"; done
    echo "$args" > "$state/args"
    {
        echo '#!/usr/bin/env bash'
        echo "cd \"$state/src\""
        printf 'args=(%s)\n' "$(printf '%q ' "$@")"
        echo 'echo "== driver start: '"$suite"' ${args[*]}, $(date -u +%FT%TZ)"'
        echo "bash benchmarks/suites/$suite.sh \"\${args[@]}\""
        echo 'echo "== driver done, exit $?, $(date -u +%FT%TZ)"'
    } > "$state/driver.sh"
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"

# What comes back: out/ as it is, its studies through the backup API (a search may be writing
# one), the driver's log and every trial worker's log under the state folder.
pack=$state/pack
rm -rf "$pack" && mkdir -p "$pack"
(cd "$BT_OUT" && find . -type f ! -name '*.db' ! -name '*.db-wal' ! -name '*.db-shm' \
    -exec cp --parents {} "$pack/" \;)
while IFS= read -r db; do
    mkdir -p "$pack/$(dirname "$db")"
    bt_sqlite_copy "$BT_OUT/$db" "$pack/$db" || echo "run.sh: $db could not be copied"
done < <(cd "$BT_OUT" && find . -type f -name '*.db')
cp "$state/driver.log" "$pack/driver.log"
find "$state" -path "$pack" -prune -o -path '*/workers/*.log' -type f -print0 \
    | xargs -0 -r tail -n +1 > "$pack/workers.log" 2>/dev/null || true
tar cf "$OUT/$suite/$suite.tar" -C "$pack" .
cp "$state/driver.log" "$OUT/$suite/driver.log"
tail -n 25 "$state/driver.log"
if bt_running "$state"; then echo "run.sh: $suite driver still running"
else echo "run.sh: $suite driver done"; fi
