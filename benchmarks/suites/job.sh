#!/usr/bin/env bash
# The job suite: committed pins applied in fresh training jobs (issues 28 and 32).
#
#   bash benchmarks/run.sh job WAIT_S [STEP...]       (device, .whl carried; default: pins)
#
# Steps, in the order given:
#   pins           (issue 28; an H200: the pins were measured there, and L5/B=64 need its
#                  memory; formerly pin_job_gpu.sh) every single-GPU pin of the README's results
#                  tables applied in a fresh training process with the README's lines and nothing
#                  else (benchmarks/pin_in_job.py), its third step's device peak against the
#                  pin's; the L5 pin also loaded before torch (pin-first) and too late (after
#                  the model is on the GPU); a probe of the torch allocator-settings entry
#                  points; and the wrapped decoder (examples/wrapped_decoder.py, LoRA) under
#                  block AC full and op on the host's transformers. Its table:
#                  `python -m benchmarks.pin_in_job_table job-*.json`.
#   trainer[=PIN]  (issue 32; formerly trainer_pin_gpu.sh) a transformers `Trainer` given a pin
#                  through `PinCallback` (benchmarks/trainer_pin_check.py), its measured step's
#                  peak against the pin's; beside it the README's plain lines with the same pin
#                  (benchmarks/pin_in_job.py), each in a fresh process. The Trainer check runs
#                  twice: the first process on a host pays its first-run effects
#                  (h100-gpt2-cache-2026-11-26/), the second does not. PIN defaults to
#                  benchmarks/results/h200-hf-2026-11-24/pin-gpt2-medium.json.
set -uo pipefail
out=${BT_OUT:?run by benchmarks/run.sh}
state=$BT_STATE
results=benchmarks/results
[ $# -ge 1 ] || set -- pins
for step in "$@"; do
    case $step in
        pins | trainer | trainer=*) ;;
        *) echo "job: unknown step '$step' (pins, trainer[=PIN])" >&2; exit 2 ;;
    esac
done
{ date -u +%FT%TZ; nvidia-smi; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } \
    > "$out/device.txt" 2>&1

pins() {
    local start name pin order policy
    start=$(date +%s)
    echo "== probe, $(date -u +%FT%TZ)"
    python3 - > $out/probe.txt 2>&1 <<'PY'
import os, torch
print("torch", torch.__version__)
print("getter", hasattr(torch._C, "_accelerator_getAllocatorSettings"),
      "setter", hasattr(torch._C, "_accelerator_setAllocatorSettings"),
      "legacy", hasattr(torch.cuda.memory, "_set_allocator_settings"))
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
get = getattr(torch._C, "_accelerator_getAllocatorSettings", lambda: None)
print("settings after a late env var:", repr(get()))
x = torch.empty(1 << 20, device="cuda")
segs = torch.cuda.memory_snapshot()
print("late env var, segments expandable:", sorted({s.get("is_expandable") for s in segs}))
PY
    echo "== wrapped decoder, $(date -u +%FT%TZ)"
    for policy in full op; do
        timeout 400 python3 -m budgettune trial -w examples/wrapped_decoder.py:build \
            -o adapter=lora -o family=llama -o num_hidden_layers=8 -o hidden_size=1024 \
            -o intermediate_size=4096 -o num_attention_heads=16 -o num_key_value_heads=4 \
            -o vocab_size=32000 -o batch_size=8 -o seq_len=1024 --device cuda \
            --ac-every 1 --ac-policy $policy --json --run-dir $state/wrapped-$policy \
            > $out/wrapped-$policy.json 2> $out/wrapped-$policy.stderr.txt
        echo "wrapped $policy exit $?"
    done
    for pin in h200-tuner-2026-11-25/tuner-W-pin.json h200-tuner-2026-11-25/tuner-L1-pin.json \
        h200-tuner-2026-11-25/tuner-L2-pin.json h200-tuner-2026-11-25/tuner-L3-pin.json \
        h200-tuner-2026-11-25/tuner-L4-pin.json h200-tuner-2026-11-25/tuner-L4-hb-pin.json \
        h200-tuner-2026-11-25/tuner-L4-lean-pin.json h200-tuner-2026-11-25/tuner-V-pin.json \
        h200-hf-2026-11-24/pin-gpt2-medium.json h200-hf-2026-11-24/pin-llama-1b.json \
        h200-tuner-2026-11-25/tuner-L5-pin.json h200-tuner-2026-11-25/tuner-L5-lean-pin.json \
        h200-pin-b64-2026-11-24/pin-b64.json; do
        name=$(basename $pin .json)
        echo "== $name, $(date -u +%FT%TZ)"
        timeout 400 python3 benchmarks/pin_in_job.py --pin $results/$pin --output $out/job-$name.json \
            >> $out/jobs.txt 2> $out/job-$name.stderr.txt
        echo "$name exit $?"
    done
    for order in pin-first late; do
        echo "== L5-lean $order, $(date -u +%FT%TZ)"
        timeout 400 python3 benchmarks/pin_in_job.py --pin $results/h200-tuner-2026-11-25/tuner-L5-lean-pin.json \
            --order $order --output $out/job-tuner-L5-lean-pin-$order.json \
            >> $out/jobs.txt 2> $out/job-L5-lean-$order.stderr.txt
        echo "L5-lean $order exit $?"
    done
    echo "pins: total $(( $(date +%s) - start )) s" >> $out/device.txt
    cat $out/jobs.txt
}

trainer() {  # $1: the pin
    local run
    for run in 1 2; do
        timeout 300 python3 benchmarks/trainer_pin_check.py --pin "$1" \
            --output "$out/trainer-check-$run.json" > "$out/trainer-check-$run.txt" 2>&1
        echo "trainer check $run exit $?"; tail -3 "$out/trainer-check-$run.txt"
    done
    timeout 300 python3 benchmarks/pin_in_job.py --pin "$1" --output "$out/job-plain.json" \
        > "$out/job-plain.txt" 2>&1
    echo "plain job exit $?"; tail -3 "$out/job-plain.txt"
}

for step in "$@"; do
    case $step in
        pins) pins ;;
        trainer) trainer $results/h200-hf-2026-11-24/pin-gpt2-medium.json ;;
        trainer=*) trainer "${step#trainer=}" ;;
    esac
done
