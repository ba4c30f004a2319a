#!/usr/bin/env bash
# The grid suite's issue-10 steps (benchmarks/suites/grid.sh runs it; formerly tuner_gpu.sh):
# the tuner's searches at issue 10's limits of the built-in Llama, each recorded against the
# grid, one limit after another on every GPU the host has (`--gpus`).
#
#   bash benchmarks/run.sh grid WAIT_S L1 L2 L4 ... [V] [B64 L5] [L3-s1] [VS-L3[:TAG]] [ref:SET]
#
# A limit runs `python -m benchmarks.tuner run L` (20 trials, 5 re-measurements, its own study
# in one SQLite file, $BT_OUT/tuner/tuner.db); a limit whose pin exists is done. B64 runs the
# reference set b64 (the B=64 grid points; L5 needs its full-AC point), appending to
# llama-b64-h200.jsonl (resumable). L3-s1 is L3's search again with sampler seed 1, in a study
# and a pin of its own (`benchmarks.limits.split_run`): with its siblings, the spread of one
# limit's search. ref:SET measures a grid of `python -m benchmarks.reference --set SET` (grid: the
# B=4 grid the limits come from, llama-grid-h200.jsonl; b8, vit, b64, issue2) into
# ref-SET.jsonl, every configuration in a fresh process, one per GPU at a time (resumable).
#
# VS-L3 (after L3, say): every pin of L3 the folder holds (its first search's and the searches
# again, `SEARCHED_AGAIN`, with their seeded repeats) and the grid's fastest points under L3,
# head to head (`python -m benchmarks.versus`), one round per GPU at a time, each GPU on its own
# share of the CPUs; appended to versus.jsonl (its report in versus-L3.md). VS-L3:TAG is a new
# head to head, of the first search's pin and the pins of the searches again with that suffix
# (tuner-L3-TAG-*-pin.json: `L3-s0 L3-s1 L3-s2 VS-L3:edge2`), into versus-TAG.jsonl.
#
# The first run on a machine copies the study database, the pins and the records from
# benchmarks/results/h200-tuner-2026-11-25/ (put what came back there first) and resumes each
# unfinished limit with the trials it still lacks (`--trials 0` once it has 20: only re-verify
# and pin). A trial cut off mid-run is failed and retried by the search; re-verification runs
# already stored count, so only the missing ones run.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/suites/grid-limits.sh LIMIT... (through run.sh grid)" >&2; exit 2; }
results=benchmarks/results
kept=$results/h200-tuner-2026-11-25
out=${BT_OUT:?run by benchmarks/run.sh}/tuner  # what comes back: h200-tuner-2026-11-25/
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1

# The limits and the grid bests are this kept study's GPU model's figures: a host of another
# model (an H100 lent for an H200) must not add trials to it.
here=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
kept_gpu=$(sed -n 2p "$kept/device.txt" 2>/dev/null | cut -d, -f1)
if [ -n "$kept_gpu" ] && [ "$here" != "$kept_gpu" ]; then
    echo "this host's GPU is $here; the kept study was measured on $kept_gpu: nothing run" >&2
    exit 3
fi
if [ ! -f "$out/tuner.db" ] && [ -f "$kept/tuner.db" ]; then
    cp "$kept/tuner.db" "$out/tuner.db"
    cp "$kept"/tuner-*-pin.json "$kept"/tuner-records.jsonl "$kept"/versus*.jsonl "$out/" \
        2>/dev/null
    cp "$results/llama-b64-h200.jsonl" "$out/" 2>/dev/null
    echo "resuming from $kept/tuner.db"
fi
# a study kept from an older budgettune: its searches refuse it until it is upgraded (on
# 2026-11-27 both stopped at once on revision 0002, and a device call was spent)
[ -f "$out/tuner.db" ] && python3 -m budgettune.cli db upgrade --storage "sqlite:///$out/tuner.db"
[ -f "$out/device.txt" ] || {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    date
    python3 -c "import torch; print(torch.__version__)"
} > "$out/device.txt" 2>&1
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
grids=("$results/llama-grid-h200.jsonl" "$results/llama-b8-h200.jsonl" "$results/vit-grid-h200.jsonl")

for limit in "$@"; do
    b64=$(ls "$out/llama-b64-h200.jsonl" 2>/dev/null)
    if [ "${limit#VS-}" != "$limit" ]; then  # the head to head of one limit's pins
        l=${limit#VS-}; tag=${l#*:}; l=${l%%:*}  # VS-L3:edge2: into versus-edge2.jsonl
        if [ "$tag" = "$l" ]; then vs=versus; tag=; else vs=versus-$tag; tag=$tag-; fi
        pins=$(ls "$out/tuner-$l-pin.json" "$out"/tuner-$l-$tag*-pin.json 2>/dev/null)
        n=$(echo "$gpus" | tr , ' ' | wc -w); rounds=$((n > 3 ? n : 3))
        echo "== $limit: $(echo $pins | wc -w) pins, $rounds rounds, GPUs $gpus, $(date -u +%FT%TZ)"
        i=0
        for g in $(echo "$gpus" | tr , ' '); do
            (python3 -m benchmarks.cpu_share $BASHPID $i $n
             python3 -m benchmarks.versus "$l" --grid "${grids[@]}" $b64 \
                --pins $pins --out "$out/$vs.jsonl" --gpus $g --rounds $rounds \
                --claims "$BT_STATE/claims-$l-$vs" > "$out/$vs-$l-gpu$g.txt" 2>&1) &
            i=$((i + 1))
        done
        wait
        cat "$out"/$vs-$l-gpu*.txt
        python3 -m benchmarks.grid30_final report "$out/$vs.jsonl" > "$out/$vs-$l.md"
        echo "== $limit: done $(date -u +%FT%TZ)"
        continue
    fi
    if [ "${limit#ref:}" != "$limit" ]; then  # a grid of benchmarks.reference (resumable)
        echo "== $limit: the reference set ${limit#ref:}, GPUs $gpus, $(date -u +%FT%TZ)"
        python3 -m benchmarks.reference --set "${limit#ref:}" --out "$out/ref-${limit#ref:}.jsonl" \
            --gpus "$gpus" --stop-after 1e9
        echo "== $limit: exit $? $(date -u +%FT%TZ)"
        continue
    fi
    if [ "$limit" = B64 ]; then  # the B=64 grid points L5 is defined by (resumable)
        echo "== B64: the reference set b64, GPUs $gpus, $(date -u +%FT%TZ)"
        python3 -m benchmarks.reference --set b64 --out "$out/llama-b64-h200.jsonl" \
            --gpus "$gpus" --stop-after 1e9
        echo "== B64: exit $? $(date -u +%FT%TZ)"
        continue
    fi
    [ -f "$out/$(bt_pin_file "$limit")" ] && { echo "== $limit: pinned"; continue; }
    study=$(python3 -c "import sys; from benchmarks.tuner import study_name; print(study_name(sys.argv[1]))" "$limit")
    done_n=$(python3 - "$study" "sqlite:///$out/tuner.db" <<'PY'
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.ERROR)
try:
    study = optuna.load_study(study_name=sys.argv[1], storage=sys.argv[2])
except Exception:
    print(0)
else:
    print(sum(t.state.is_finished() for t in study.trials))  # not those queued or cut
PY
)
    left=$((20 - done_n)); [ "$left" -ge 0 ] || left=0  # 0: only re-verify and pin
    echo "== $limit ($study): $done_n trials done, $left to run, GPUs $gpus, $(date -u +%FT%TZ)"
    python3 -m benchmarks.tuner run "$limit" --grid "${grids[@]}" $b64 \
        --storage "sqlite:///$out/tuner.db" --pins "$out" \
        --out "$out/tuner-records.jsonl" --trials "$left" --reverify 5 --gpus "$gpus"
    echo "== $limit: exit $? $(date -u +%FT%TZ)"
done
