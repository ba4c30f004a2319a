#!/usr/bin/env bash
# Issue 33, the offload hooks without record_stream: the two offload points of the
# offload33 studies measured again, each beside the same configuration without offload on the
# other GPU of the host (so each pair shares a card type), on the built-in Llama at BATCH.
#
#   bash benchmarks/offload_fix_gpu.sh [BATCH]    (device, .whl carried; $OUT/offload-fix/)
#
# Pairs (fused AdamW, expandable segments, as the studies settled):
#   lo: full block AC on every block, with and without offload on every block;
#   hi: full block AC on every 2nd block, with and without offload on every block.
# On one GPU the four run one after the other.
set -uo pipefail
batch=${1:-32}
out=${OUT:-/tmp/out}/offload-fix
mkdir -p "$out"
source benchmarks/device_env.sh || exit 1
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch; print('torch', torch.__version__)"; } > "$out/device.txt" 2>&1
IFS=, read -ra gpu <<< "$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)"
trial() {  # trial NAME GPU ARGS...
    local name=$1 g=$2; shift 2
    echo "== $name on GPU $g, $(date -u +%FT%TZ)"
    CUDA_VISIBLE_DEVICES=$g timeout 600 python3 -m budgettune trial -w builtin:llama \
        -o batch_size=$batch --device cuda --optimizer-impl fused \
        --cuda-alloc-conf expandable_segments:True --json --run-dir /tmp/bt-offload-fix/$name \
        "$@" > "$out/$name.json" 2> "$out/$name.stderr.txt"
    echo "   $name exit $?"
}
pair() {  # pair NAME ARGS...: with offload on the first GPU, without on the second
    local name=$1; shift
    if [ ${#gpu[@]} -gt 1 ]; then
        trial "$name-offload-1" "${gpu[0]}" "$@" --offload-every 1 &
        trial "$name-no-offload" "${gpu[1]}" "$@" &
        wait
    else
        trial "$name-offload-1" "${gpu[0]}" "$@" --offload-every 1
        trial "$name-no-offload" "${gpu[0]}" "$@"
    fi
}
pair lo-full-ac-every-1 --block-ac-every 1
pair hi-full-ac-every-2 --block-ac-every 2
python3 - "$out" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(f.read_text()); m = r.get("measurement") or {}
    print(f"{f.stem:32s} {r.get('outcome')} {r.get('device_name')} device "
          f"{m.get('peak_device_bytes', 0) / 1e9:.2f} GB alloc "
          f"{m.get('peak_allocated_bytes', 0) / 1e9:.2f} GB moved "
          f"{m.get('offload_bytes', 0) / 1e9:.2f} GB {m.get('step_time_ms', 0):.1f} ms")
PY
