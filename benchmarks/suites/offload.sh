#!/usr/bin/env bash
# The offload suite (issue 33; formerly offload_gpu.sh): offload searched with recompute, on the
# built-in Llama (1B shape) at a batch where activations dominate the peak.
#
#   bash benchmarks/run.sh offload WAIT_S [BATCH] [TRIALS]   (device, .whl carried; BATCH
#                                                            default 32, TRIALS per search 16)
#
# On a host of two GPUs or more the independent steps run side by side, one GPU each (the two
# calibrations, the two searches, the two jobs, the probe's variants); every figure is one
# process on one GPU, so peaks stay per process.
#
# 1. Calibration: `budgettune trial` of the unconstrained baseline (budget 1.0) and full block AC
#    (every block), fused AdamW, expandable segments; their device peaks give the two limits:
#    hi halfway between them, lo 1 % under full block AC's (margin 0 at lo: at or below it).
# 2. One search per limit with offload in the space (--offload-every 0,1,2,
#    --block-ac-policies full,op,op_offload), TRIALS trials, 2 re-verifications of the top 3.
# 3. Each pin applied in a fresh training process with the README's lines
#    (benchmarks/pin_in_job.py): its device peak against the pin's.
# 4. The probe (benchmarks/offload_probe.py): which offload mechanisms run on this torch, each
#    variant in its own process on a small Llama (its peaks are per process).
#
# The work outlasts one lease: put what came back in benchmarks/results/offload33/; the next
# machine's first run copies that folder into its out/ and resumes from it (the probe, the
# calibration and finished jobs are skipped; a study resumes from its database up to TRIALS
# trials: a larger TRIALS adds trials to a finished one, then its pin and job are made again).
set -uo pipefail
batch=${1:-32}
trials=${2:-16}
[[ $batch =~ ^[0-9]+$ && $trials =~ ^[0-9]+$ ]] || { echo "usage: bash benchmarks/run.sh offload WAIT_S [BATCH] [TRIALS]" >&2; exit 2; }
state=${BT_STATE:?run by benchmarks/run.sh}
out=$BT_OUT
kept=benchmarks/results/offload33
if [ -d "$kept" ]; then
    for f in "$kept"/*; do
        [ -f "$f" ] && [ ! -f "$out/$(basename "$f")" ] && cp "$f" "$out/"
    done
fi
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  nproc; free -g | head -2; } >> "$out/device.txt" 2>&1
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
w="-w builtin:llama -o batch_size=$batch --device cuda"
IFS=, read -ra gpu <<< "$gpus"
# side by side: the i-th of a step's jobs goes to GPU i (mod the host's count); with one GPU
# they run one after the other
slot=0
on_gpu() {  # on_gpu COMMAND...: run it on the next GPU, in the background if others are free
    local g=${gpu[$((slot % ${#gpu[@]}))]}
    slot=$((slot + 1))
    if [ ${#gpu[@]} -gt 1 ]; then CUDA_VISIBLE_DEVICES=$g "$@" &
    else CUDA_VISIBLE_DEVICES=$g "$@"; fi
    [ $((slot % ${#gpu[@]})) -eq 0 ] && wait
}
step_done() { wait; slot=0; }
calibrate() {  # calibrate BASE
    local ac=""; [ $1 = full-ac ] && ac="--block-ac-every 1"
    echo "== calibrate $1 on GPU $CUDA_VISIBLE_DEVICES, $(date -u +%FT%TZ)"
    timeout 900 python3 -m budgettune trial $w $ac --optimizer-impl fused \
        --cuda-alloc-conf expandable_segments:True --json --run-dir $state/calibrate-$1 \
        > $out/calibrate-$1.json 2> $out/calibrate-$1.stderr.txt
}
for base in unconstrained full-ac; do
    [ -f $out/calibrate-$base.json ] || on_gpu calibrate $base
done
step_done
read hi lo <<< "$(python3 - $out <<'PY'
import json, sys
peak = lambda n: json.load(open(f"{sys.argv[1]}/calibrate-{n}.json"))["measurement"]["peak_device_bytes"]
full, unconstrained = peak("full-ac"), peak("unconstrained")
print((full + unconstrained) // 2, int(full * 0.99))
PY
)"
echo "limits: hi $hi bytes, lo $lo bytes" | tee $out/limits.txt
[ -n "$lo" ] || { echo "== calibration failed: no limits, driver stopped"; exit 1; }
search() {  # search LEVEL LIMIT MARGIN: one study per database (two searches write at once)
    local db=$out/offload33-$1.db
    # a study from an earlier machine resumes up to TRIALS trials, counted as the search
    # counts them (its --trials N adds N to what the study holds); none left and a pin: done
    local left=$(python3 - $db offload33-$1 $trials <<'PY'
import sys, pathlib, optuna
from budgettune.study.target import study_count
db, name, trials = sys.argv[1], sys.argv[2], int(sys.argv[3])
if not pathlib.Path(db).exists() or name not in optuna.get_all_study_names(f"sqlite:///{db}"):
    print(trials)
else:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    count = study_count(study, trial_timeout_s=900, heartbeat_s=10)
    print(max(trials - (count.counted - count.waiting), 0))
PY
)
    [ -n "$left" ] || { echo "== search $1: its study could not be counted"; return; }
    if [ "$left" = 0 ] && [ -f $out/pin-$1.json ]; then return; fi
    rm -f $out/job-$1.json  # a new pin gets a new job
    echo "== search $1 ($2 bytes, $left trials to go) on GPU $CUDA_VISIBLE_DEVICES, $(date -u +%FT%TZ)"
    echo "== $(date -u +%FT%TZ), $left trials to go" >> $out/search-$1.txt
    timeout 7200 python3 -m budgettune search $w --max-mem ${2}B --margin $3 \
        --trials $left --reverify 2 --offload-every 0,1,2 --block-ac-policies full,op,op_offload \
        --storage sqlite:///$db --study offload33-$1 \
        --runs-dir $state/runs-$1 --output $out/pin-$1.json >> $out/search-$1.txt 2>&1
    echo "search $1 exit $?, $(date -u +%FT%TZ)"
    python3 -m budgettune show --storage sqlite:///$db --study offload33-$1 \
        > $out/show-$1.txt 2>&1
}
on_gpu search hi $hi 0.03
on_gpu search lo $lo 0
step_done
job() {  # job LEVEL: the pin applied in a fresh training process with the README's lines
    echo "== pin $1 in a fresh job on GPU $CUDA_VISIBLE_DEVICES, $(date -u +%FT%TZ)"
    timeout 900 python3 benchmarks/pin_in_job.py --pin $out/pin-$1.json \
        --output $out/job-$1.json > $out/job-$1.txt 2> $out/job-$1.stderr.txt
    echo "job $1 exit $?"
}
for level in hi lo; do
    [ -f $out/pin-$level.json ] && [ ! -f $out/job-$level.json ] && on_gpu job $level
done
step_done
probe() {  # probe VARIANT
    echo "== probe $1 on GPU $CUDA_VISIBLE_DEVICES, $(date -u +%FT%TZ)"
    timeout 400 python3 benchmarks/offload_probe.py $1 --output $out/probe-$1.json \
        > $out/probe-$1.txt 2>&1
}
for v in none op op-offload-compiled hooks-per-block hooks-whole-compiled; do
    [ -f $out/probe-$v.json ] || on_gpu probe $v
done
step_done
