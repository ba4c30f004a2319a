#!/usr/bin/env bash
# Issue 32 on one GPU: a transformers `Trainer` given a pin through `PinCallback`
# (benchmarks/trainer_pin_check.py), its measured step's peak against the pin's; beside it the
# README's plain lines with the same pin (benchmarks/pin_in_job.py), each in a fresh process.
# The Trainer check runs twice: the first process on a host pays its first-run effects
# (h100-gpt2-cache-2026-11-26/), the second does not.
#
#   bash benchmarks/trainer_pin_gpu.sh [PIN]      (device, .whl carried; results in $OUT)
set -uo pipefail
pin=${1:-benchmarks/results/h200-hf-2026-11-24/pin-gpt2-medium.json}
source benchmarks/device_env.sh || exit 1
out=${OUT:-/tmp/bt-trainer}
mkdir -p "$out"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$out/device.txt" 2>&1
cat "$out/device.txt"
for run in 1 2; do
    timeout 300 python3 benchmarks/trainer_pin_check.py --pin "$pin" \
        --output "$out/trainer-check-$run.json" > "$out/trainer-check-$run.txt" 2>&1
    echo "trainer check $run exit $?"; tail -3 "$out/trainer-check-$run.txt"
done
timeout 300 python3 benchmarks/pin_in_job.py --pin "$pin" --output "$out/job-plain.json" \
    > "$out/job-plain.txt" 2>&1
echo "plain job exit $?"; tail -3 "$out/job-plain.txt"
