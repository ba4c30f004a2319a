#!/usr/bin/env bash
# Issue 10's wall-time figure on a multi-GPU host, and how it scales from one GPU to several.
#
#   bash benchmarks/wall_gpu.sh WAIT_S PHASE...        (device, .whl carried)
#
# Each PHASE is one or more searches run side by side, separated by "/"; each search is the GPU
# list it is given (`--gpus`). `0,1 0/1` first runs one search on GPUs 0 and 1, then two
# one-GPU searches at once (GPU 0 and GPU 1: two measurements of the one-GPU figure, under the
# same CPU load as the two-GPU search's two trial processes). Every search is
# `budgettune search studies/llama-1b.toml` as written (its limit, top-k, re-verification count),
# 20 trials, in a SQLite file and a runs folder of its own (cold compile caches), timed from its
# command's start; `python -m benchmarks.tuner wall` appends its record.
#
# Like tuner_gpu.sh: the first call starts a detached driver (state in /tmp/bt-wall), every call
# waits up to WAIT_S seconds and brings back the studies (SQLite backups), the logs, the pins and
# the records. Make the next call at once: the driver lives only while the machine is held. A
# figure is one uninterrupted search, so a driver on a new machine starts its phases afresh.
set -uo pipefail
[ $# -ge 2 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/wall_gpu.sh WAIT_S PHASE... (e.g. 555 0,1 0/1)" >&2; exit 2; }
wait_s=$1
shift
state=/tmp/bt-wall
mkdir -p "$state"

source benchmarks/device_env.sh || exit 1

if bt_needs_driver "$state"; then
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        date
        python3 -c "import torch; print(torch.__version__)"
        nproc
    } > "$state/device.txt" 2>&1
    stamp=$(date -u +%Y%m%dT%H%M)
    {
        echo '#!/usr/bin/env bash'
        echo "cd \"$PWD\""
        echo 'source benchmarks/device_env.sh'
        echo 'one() {  # one search: $1 = its GPU list, $2 = its record name'
        echo '    local gpus=$1 name=$2 n study start'
        echo '    n=$(echo "$gpus" | tr , "\n" | wc -l)'
        echo "    study=wall-\${n}gpu-g\${gpus//,/}-$stamp"
        echo '    echo "== $study: GPUs $gpus, $(date -u +%FT%TZ)"'
        echo '    start=$(date +%s)'
        echo '    python3 -m budgettune.cli search studies/llama-1b.toml --trials 20 \'
        echo "        --storage sqlite:///$state/\$study.db --study \$study \\"
        echo "        --runs-dir $state/runs-\$study --output $state/\$study-pin.json \\"
        echo "        --gpus \$gpus > $state/\$study.txt 2>&1 &&"
        echo "    python3 -m benchmarks.tuner wall --storage sqlite:///$state/\$study.db \\"
        echo "        --pin $state/\$study-pin.json --gpus \$n --name \"\$name\" \\"
        echo '        --command-wall-s $(($(date +%s) - start)) \'
        echo "        --out $state/wall-records.jsonl"
        echo '    echo "== $study: exit $? after $(($(date +%s) - start)) s, $(date -u +%FT%TZ)"'
        echo '}'
        for phase in "$@"; do
            echo "echo \"=== phase $phase\""
            for gpus in ${phase//\// }; do
                word=GPU; [ "${gpus//,/}" = "$gpus" ] || word=GPUs
                name="studies/llama-1b.toml as written, $word $gpus"
                for other in ${phase//\// }; do  # the searches run at the same time
                    [ "$other" = "$gpus" ] || name="$name, beside the same search on GPU(s) $other"
                done
                echo "one $gpus \"$name\" &"
            done
            echo 'wait'
        done
        echo 'echo "== driver done"'
    } > "$state/driver.sh"
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
mkdir -p "$state/out"
for db in "$state"/wall-*.db; do
    [ -f "$db" ] && bt_sqlite_copy "$db" "$state/out/$(basename "$db")"
done
cp "$state"/device.txt "$state"/driver.log "$state"/wall-*.txt "$state"/wall-*-pin.json \
    "$state"/wall-records.jsonl "$state/out/" 2>/dev/null
cat "$state"/runs-*/*/workers/*.log > "$state/out/workers.log" 2>/dev/null
# a device command brings back at most 8 files: one archive
tar cf "$OUT/wall.tar" -C "$state/out" .
tail -n 20 "$state/driver.log"
for f in "$state"/wall-*.txt; do [ -f "$f" ] && { echo "--- $f"; tail -n 4 "$f"; }; done
