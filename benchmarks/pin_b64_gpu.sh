#!/usr/bin/env bash
# Issue 12 on a two-GPU host: the case the tool exists for. builtin:llama at B=64 does not fit
# at budget 1.0 on an H200; under 120 GB the search must still end with a pin (exit 0) that fits
# with the margin, and report its slowdown against full block AC. Everything lands in $OUT.
#   device tool: bash benchmarks/pin_b64_gpu.sh        (after the .whl install line)
#   GPUS=0 TRIALS=6 bash benchmarks/pin_b64_gpu.sh   (a one-GPU host; 8 trials take ~10 min there)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__)"; } \
    > "$OUT/device.txt" 2>&1
GPUS=${GPUS:-0,1}
TRIALS=${TRIALS:-8}
echo "gpus $GPUS trials $TRIALS" >> "$OUT/device.txt"
start=$(date +%s)
python3 -m budgettune search -w builtin:llama -o batch_size=64 --device cuda --max-mem 120GB \
    --trials "$TRIALS" --gpus "$GPUS" --top-k 1 --reverify 2 --storage "$OUT/b64.db" --study llama-b64-120GB \
    --runs-dir /tmp/runs --output "$OUT/pin-b64.json" > "$OUT/search.txt" 2>&1
echo "exit $? after $(( $(date +%s) - start )) s" >> "$OUT/search.txt"
python3 -m budgettune show --storage "$OUT/b64.db" --study llama-b64-120GB >> "$OUT/search.txt" 2>&1
tail -n +1 /tmp/runs/*/workers/*.log > "$OUT/workers-logs.txt" 2>&1
