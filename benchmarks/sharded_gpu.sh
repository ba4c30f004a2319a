#!/usr/bin/env bash
# Issue 15 on a two-GPU host: the built-in Llama sharded with FSDP2 under torchrun (2 ranks),
# B=8 T=2048 per rank, limit 42 GB allocated per rank (studies/llama-2xh200-sharded.toml);
# the study measures unconstrained, full block AC, budget 0.5 and torchtitan's op SAC as
# baselines, then searched budgets; the pin reports its slowdown against full AC and op SAC.
# Then `show`, and the pin applied by load_pinned(...).compile on each rank of a torchrun
# training job (benchmarks/sharded_pin_check.py), per-rank peak vs the pin's (target 2 %).
# Everything lands in $OUT as it is written. Sized for under 9 minutes (each trial compiles:
# ~40 s; 6 trials + 4 single re-measurements + the check). The limit and the batch fit a
# two-GPU host of 80 GB cards as well as H200s (budget 1.0: 49.7 GB allocated per rank).
#   device tool: bash benchmarks/sharded_gpu.sh        (.whl carried; installs it once)
set -u
export PYTHONUNBUFFERED=1
source benchmarks/device_env.sh || exit 1
OUT=${OUT:-/tmp/out}
TRIALS=${TRIALS:-6}
mkdir -p "$OUT"
{ date -u +%FT%TZ; nvidia-smi; python3 -c "import torch; print('torch', torch.__version__)"; } \
    > "$OUT/device.txt" 2>&1
start=$(date +%s)
timeout 480 python3 -m budgettune search studies/llama-2xh200-sharded.toml --gpus 0,1 \
    --nproc-per-node 2 --trials "$TRIALS" --storage "$OUT/sharded.db" \
    --study llama-2xh200-sharded --runs-dir /tmp/runs --output "$OUT/pin-sharded.json" \
    > "$OUT/search.txt" 2>&1
echo "exit $? after $(( $(date +%s) - start )) s" >> "$OUT/search.txt"
python3 -m budgettune show --storage "$OUT/sharded.db" --study llama-2xh200-sharded \
    > "$OUT/show.txt" 2>&1
tail -n +1 /tmp/runs/*/workers/*.log > "$OUT/workers-logs.txt" 2>&1
mkdir -p "$OUT/trial-logs"
for log in /tmp/runs/llama-2xh200-sharded/*/trial.log; do
    name=$(basename "$(dirname "$log")"); tail -n 60 "$log" > "$OUT/trial-logs/$name.log"
done
if [ -f "$OUT/pin-sharded.json" ]; then
    timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/sharded_pin_check.py --pin "$OUT/pin-sharded.json" \
        --output "$OUT/pin-check.json" > "$OUT/pin-check.txt" 2>&1
    echo "exit $?" >> "$OUT/pin-check.txt"
fi
echo "total $(( $(date +%s) - start )) s" >> "$OUT/device.txt"
