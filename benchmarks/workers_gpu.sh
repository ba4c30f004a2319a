#!/usr/bin/env bash
# Issue 4 on a two-GPU host: the same builtin:llama study with 2 workers (--gpus 0,1), then with
# 1 worker (--gpus 0); trials/hour of each comes from the trials' own timestamps
# (benchmarks/workers_rate.py). Everything lands in $OUT as it is written, so a run cut short by
# the device lease still returns the finished trials.
#   device tool: bash benchmarks/workers_gpu.sh        (after the .whl install line)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__)"; } \
    > "$OUT/device.txt" 2>&1
common=(-w builtin:llama --device cuda --max-mem 18GB --backend aot_eager_decomp_partition
        --trials 8 --top-k 1 --reverify 1 --warmup-steps 2 --timed-steps 5 --seed 0
        --storage "$OUT/workers.db")
python3 -m budgettune.cli search "${common[@]}" --study llama-2workers --gpus 0,1 \
    --runs-dir /tmp/runs --output "$OUT/pin-2workers.json" > "$OUT/2workers.txt" 2>&1
echo "exit $?" >> "$OUT/2workers.txt"
tail -n +1 /tmp/runs/*/workers/*.log > "$OUT/2workers-logs.txt" 2>&1
python3 -m budgettune.cli search "${common[@]}" --study llama-1worker --gpus 0 \
    --runs-dir /tmp/runs1 --output "$OUT/pin-1worker.json" > "$OUT/1worker.txt" 2>&1
echo "exit $?" >> "$OUT/1worker.txt"
