#!/usr/bin/env bash
# The grid suite's issue-30 steps (benchmarks/suites/grid.sh runs it; formerly
# grid_vs_search_gpu.sh): for each workload of benchmarks/grid_vs_search.py named (gpt2m,
# llama1b, vit), its hand grid, then one 12-trial search per sampler seed (0, 1, 2). One worker
# per GPU takes, workload by workload, the grid points and then the seeds that no other worker
# has claimed (files in $BT_STATE/claims), so every GPU stays busy: a GPU done with its share of
# one workload starts on the next while a search of the first still runs.
#
#   [BT_SAMPLERS="tpe gp"] bash benchmarks/run.sh grid WAIT_S gpt2m llama1b vit
#
# Each worker keeps to its own share of the host's CPUs (benchmarks/cpu_share.py), so one GPU's
# compile does not slow another's timed steps. A workload's head-to-head
# (`benchmarks/grid30_final.py`: the grid's fastest fitting points and the pins, timed alike in
# rotating rounds; final.jsonl, the verdict) starts once all that workload's searches are
# recorded, on the GPUs whose search work is done, each taking a round of its own; searches
# come first, so the long ones start at once and the head-to-heads fill the gaps.
#
# What comes back: the grid (grid30.jsonl), the search records (records.jsonl), the head-to-head
# (final.jsonl), the pins, the studies, the logs and report.md. The work outlasts one 30-minute
# lease: put what came back in benchmarks/results/grid30/ (for H200s; with the card's name
# appended for another card) before the next call, since a machine handed back while idle comes
# back bare; the next machine's first run resumes from that folder (grid points and searches
# already recorded are skipped; a study cut off resumes its trials).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/suites/grid-hand.sh NAME... (through run.sh grid)" >&2; exit 2; }
names=$*
samplers=${BT_SAMPLERS:-tpe}  # BT_SAMPLERS="tpe gp": the Gaussian-process sampler's seeds too
state=${BT_STATE:?run by benchmarks/run.sh}
out=$BT_OUT/grid30  # what comes back: benchmarks/results/grid30/ (or its card's folder)
claims=$state/claims
kept=benchmarks/results/grid30
mkdir -p "$out/pins"
export PYTHONUNBUFFERED=1

# Timings are compared on one kind of card: a host of another kind starts its own folder.
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ -f "$kept/device.txt" ] && ! grep -qF "$gpu_name" "$kept/device.txt"; then
    kept=$kept-$(echo "$gpu_name" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')
    echo "$gpu_name is not the card of benchmarks/results/grid30/: resuming from $kept/ (put what comes back there)"
fi
# the records, and the logs, which the workers append to (run 5's first call found none here
# and brought back only its own: the earlier runs' logs came back from git)
for f in grid30.jsonl records.jsonl final.jsonl device.txt "$kept"/*.txt; do
    f=$(basename "$f")
    [ -f "$out/$f" ] || cp "$kept/$f" "$out/" 2>/dev/null
done
# the earlier drivers' log apart: this driver's is driver.log
[ -f "$out/driver-kept.log" ] || cp "$kept/driver.log" "$out/driver-kept.log" 2>/dev/null
for db in "$kept"/*.db; do
    [ -f "$db" ] && [ ! -f "$out/$(basename "$db")" ] && cp "$db" "$out/"
done
for db in "$out"/*.db; do  # a study kept from an older budgettune's schema
    [ -f "$db" ] && python3 -m budgettune.cli db upgrade --storage "sqlite:///$db" > /dev/null
done
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  nproc; } >> "$out/device.txt" 2>&1

share() {  # this worker's shell (and all it starts) on CPU share $1 of $2
    python3 -m benchmarks.cpu_share $BASHPID $1 $2
}
final() {  # GPU $1: workload $2's head-to-head rounds still unclaimed ($3: wait for its searches)
    local studies=""
    if [ "${3:-}" = wait ]; then
        for sampler in $samplers; do for seed in 0 1 2; do
            studies="$studies grid30-$2-s$seed$([ $sampler = tpe ] || echo -$sampler)"
        done; done
    fi
    python3 -m benchmarks.grid30_final measure $2 --grid $out/grid30.jsonl \
        --records $out/records.jsonl --out $out/final.jsonl --gpus $1 \
        --claims $claims ${studies:+--wait-for $studies} > $state/final-$1.txt 2>&1
    # kept: what measured a round, or failed; not "waiting for ..." (exit 3) nor a poll that
    # found every round claimed (its report only; the logs of run 5 held it six times)
    case $? in
        3) ;;
        0) grep -q "^round " $state/final-$1.txt && cat $state/final-$1.txt >> $out/final-$2.txt ;;
        *) cat $state/final-$1.txt >> $out/final-$2.txt ;;
    esac
}
worker() {  # one GPU: every workload in turn, its unclaimed grid points, then its unclaimed
    # seeds; then, while other GPUs still search, the head-to-head rounds of the workloads
    # whose searches are all recorded
    local g=$1
    share $2 $3
    touch $state/busy-$g
    for name in $names; do
        python3 -m benchmarks.grid_vs_search grid $name --out $out/grid30.jsonl --gpus $g \
            --claims $claims --stop-after 100000 >> $out/grid-$name-gpu$g.txt 2>&1
        for sampler in $samplers; do
            for seed in 0 1 2; do
                study=grid30-$name-s$seed$([ $sampler = tpe ] || echo -$sampler)
                [ -e $claims/search-$study ] && continue
                echo "== GPU $g: $study, $(date -u +%FT%TZ)"
                python3 -m benchmarks.grid_vs_search search $name --grid $out/grid30.jsonl \
                    --seed $seed --sampler $sampler --storage sqlite:///$out/$study.db \
                    --pins $out/pins --out $out/records.jsonl --gpus $g --claims $claims \
                    >> $out/search-${study#grid30-}.txt 2>&1
            done
        done
    done
    rm -f $state/busy-$g
    echo "== GPU $g: searches done, $(date -u +%FT%TZ)"
    while :; do
        [ -n "$(ls $state/busy-* 2>/dev/null)" ] && busy=yes || busy=no
        for name in $names; do final $g $name wait; done
        [ $busy = yes ] || break
        sleep 20
    done
    echo "== GPU $g: nothing left, $(date -u +%FT%TZ)"
}
finals() {  # one GPU, once every search is done (or failed): the head-to-heads still unclaimed
    local g=$1
    share $2 $3
    for name in $names; do final $g $name; done
}
gpus=($(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd' ' -))
rm -f $state/busy-*
for i in ${!gpus[@]}; do worker ${gpus[$i]} $i ${#gpus[@]} & done
wait
for i in ${!gpus[@]}; do finals ${gpus[$i]} $i ${#gpus[@]} & done
wait
{ python3 -m benchmarks.grid_vs_search report --records $out/records.jsonl
  echo; python3 -m benchmarks.grid30_final report $out/final.jsonl; } > $out/report.md 2>&1
cat $out/report.md
