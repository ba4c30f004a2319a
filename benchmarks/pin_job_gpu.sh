#!/usr/bin/env bash
# Issue 28 on one GPU host (an H200: the pins were measured there, and L5/B=64 need its memory):
# every single-GPU pin of the README's results tables applied in a fresh training process with
# the README's lines and nothing else (benchmarks/pin_in_job.py), its third step's device peak
# against the pin's; the L5 pin also loaded before torch (pin-first) and too late (after the
# model is on the GPU); a probe of the torch allocator-settings entry points; and the wrapped
# decoder (examples/wrapped_decoder.py, LoRA) under block AC full and op on the host's
# transformers.
#
#   bash benchmarks/pin_job_gpu.sh WAIT_S        (device, .whl carried)
#
# A detached driver (state in /tmp/bt-pinjob) runs it all, from a copy of benchmarks/ and
# examples/ taken when it starts (a later call re-sends the working tree); every call waits up
# to WAIT_S seconds and returns what exists as $OUT/pinjob.tar.
set -uo pipefail
[ $# -eq 1 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/pin_job_gpu.sh WAIT_S (e.g. 560)" >&2; exit 2; }
wait_s=$1
state=/tmp/bt-pinjob
mkdir -p "$state/out"

source benchmarks/device_env.sh || exit 1

if bt_needs_driver "$state"; then
    rm -rf "$state/src" && mkdir -p "$state/src" && cp -r benchmarks examples "$state/src/"
    { date -u +%FT%TZ; nvidia-smi; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } \
        > "$state/out/device.txt" 2>&1
    cat > "$state/driver.sh" <<'EOF'
#!/usr/bin/env bash
state=/tmp/bt-pinjob
cd "$state/src"
source /tmp/bt-pinjob/env.sh
start=$(date +%s)
out=$state/out
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
results=benchmarks/results
pins="h200-tuner-2026-11-25/tuner-W-pin.json h200-tuner-2026-11-25/tuner-L1-pin.json
h200-tuner-2026-11-25/tuner-L2-pin.json h200-tuner-2026-11-25/tuner-L3-pin.json
h200-tuner-2026-11-25/tuner-L4-pin.json h200-tuner-2026-11-25/tuner-L4-hb-pin.json
h200-tuner-2026-11-25/tuner-L4-lean-pin.json h200-tuner-2026-11-25/tuner-V-pin.json
h200-hf-2026-11-24/pin-gpt2-medium.json h200-hf-2026-11-24/pin-llama-1b.json
h200-tuner-2026-11-25/tuner-L5-pin.json h200-tuner-2026-11-25/tuner-L5-lean-pin.json
h200-pin-b64-2026-11-24/pin-b64.json"
for pin in $pins; do
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
echo "total $(( $(date +%s) - start )) s" >> $out/device.txt
echo "== driver done, $(date -u +%FT%TZ)"
EOF
    declare -p PYTHONPATH PYTHONPYCACHEPREFIX | sed 's/^declare -x/export/' > "$state/env.sh"
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
cp "$state/driver.log" "$state/out/" 2>/dev/null
tar cf "$OUT/pinjob.tar" -C "$state/out" .
cat "$state/driver.log"
cat "$state/out/jobs.txt" 2>/dev/null
true
