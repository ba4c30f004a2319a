#!/usr/bin/env bash
# The workers suite (issue 4; formerly workers_gpu.sh), on a two-GPU host: the same
# builtin:llama study with 2 workers (--gpus 0,1), then with 1 worker (--gpus 0); trials/hour of
# each from the trials' own timestamps (benchmarks/workers_rate.py, into rate.md).
#
#   bash benchmarks/run.sh workers WAIT_S              (device, .whl carried)
set -uo pipefail
out=${BT_OUT:?run by benchmarks/run.sh}
state=$BT_STATE
export PYTHONUNBUFFERED=1
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__)"; } \
    > "$out/device.txt" 2>&1
rm -f "$out/workers.db"  # two fresh studies: a rate is one uninterrupted run
common=(-w builtin:llama --device cuda --max-mem 18GB --backend aot_eager_decomp_partition
        --trials 8 --top-k 1 --reverify 1 --warmup-steps 2 --timed-steps 5 --seed 0
        --storage "$out/workers.db")
python3 -m budgettune.cli search "${common[@]}" --study llama-2workers --gpus 0,1 \
    --runs-dir "$state/runs2" --output "$out/pin-2workers.json" > "$out/2workers.txt" 2>&1
echo "exit $?" >> "$out/2workers.txt"
tail -n +1 "$state"/runs2/*/workers/*.log > "$out/2workers-logs.txt" 2>&1
python3 -m budgettune.cli search "${common[@]}" --study llama-1worker --gpus 0 \
    --runs-dir "$state/runs1" --output "$out/pin-1worker.json" > "$out/1worker.txt" 2>&1
echo "exit $?" >> "$out/1worker.txt"
tail -n +1 "$state"/runs1/*/workers/*.log > "$out/1worker-logs.txt" 2>&1
python3 -m benchmarks.workers_rate "sqlite:///$out/workers.db" \
    --logs "$out/2workers-logs.txt" "$out/1worker-logs.txt" > "$out/rate.md" 2>&1
cat "$out/rate.md"
