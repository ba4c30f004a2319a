#!/usr/bin/env bash
# The grid suite's wall-time steps (benchmarks/suites/grid.sh runs it; formerly wall_gpu.sh):
# issue 10's wall-time figure on one GPU or several, and how it scales.
#
#   bash benchmarks/run.sh grid WAIT_S wall:PHASE...      e.g. wall:0,1 wall:0/1
#
# Each PHASE is one or more searches run side by side, separated by "/"; each search is the GPU
# list it is given (`--gpus`). `wall:0,1 wall:0/1` first runs one search on GPUs 0 and 1, then
# two one-GPU searches at once (GPU 0 and GPU 1: two measurements of the one-GPU figure, under
# the same CPU load as the two-GPU search's two trial processes). Every search is
# `budgettune search studies/llama-1b.toml` as written (its limit, top-k, re-verification
# count), 20 trials, in a SQLite file and a runs folder of its own (cold compile caches), timed
# from its command's start; `python -m benchmarks.tuner wall` appends its record to
# wall-records.jsonl. A figure is one uninterrupted search, so a driver on a new machine starts
# its phases afresh.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/suites/grid-wall.sh PHASE... (through run.sh grid)" >&2; exit 2; }
out=${BT_OUT:?run by benchmarks/run.sh}/wall
mkdir -p "$out"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    date
    python3 -c "import torch; print(torch.__version__)"
    nproc
} > "$out/device.txt" 2>&1
stamp=$(date -u +%Y%m%dT%H%M)

one() {  # one search: $1 = its GPU list, $2 = its record name
    local gpus=$1 name=$2 n study start
    n=$(echo "$gpus" | tr , "\n" | wc -l)
    study=wall-${n}gpu-g${gpus//,/}-$stamp
    echo "== $study: GPUs $gpus, $(date -u +%FT%TZ)"
    start=$(date +%s)
    python3 -m budgettune.cli search studies/llama-1b.toml --trials 20 \
        --storage "sqlite:///$out/$study.db" --study "$study" \
        --runs-dir "$BT_STATE/runs-$study" --output "$out/$study-pin.json" \
        --gpus "$gpus" > "$out/$study.txt" 2>&1 &&
    python3 -m benchmarks.tuner wall --storage "sqlite:///$out/$study.db" \
        --pin "$out/$study-pin.json" --gpus "$n" --name "$name" \
        --command-wall-s $(($(date +%s) - start)) \
        --out "$out/wall-records.jsonl"
    echo "== $study: exit $? after $(($(date +%s) - start)) s, $(date -u +%FT%TZ)"
}

for phase in "$@"; do
    echo "=== phase $phase"
    for gpus in ${phase//\// }; do
        word=GPU; [ "${gpus//,/}" = "$gpus" ] || word=GPUs
        name="studies/llama-1b.toml as written, $word $gpus"
        for other in ${phase//\// }; do  # the searches run at the same time
            [ "$other" = "$gpus" ] || name="$name, beside the same search on GPU(s) $other"
        done
        one "$gpus" "$name" &
    done
    wait
done
for f in "$out"/wall-*.txt; do [ -f "$f" ] && { echo "--- $f"; tail -n 4 "$f"; }; done
true
