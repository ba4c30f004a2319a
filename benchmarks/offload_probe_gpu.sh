#!/usr/bin/env bash
# Issue 33 feasibility on one GPU: benchmarks/offload_probe.py's variants, each in its own
# process, side by side (peaks are per process; timings only indicative).
#   bash benchmarks/offload_probe_gpu.sh        (device, .whl carried; results in $OUT)
set -uo pipefail
source benchmarks/device_env.sh || exit 1
out=${OUT:-/tmp/bt-offload}
mkdir -p "$out"
for v in none op op-offload-compiled hooks-per-block hooks-whole-compiled; do
    timeout 400 python3 benchmarks/offload_probe.py $v --output "$out/$v.json" > "$out/$v.txt" 2>&1 &
done
wait
for v in none op op-offload-compiled hooks-per-block hooks-whole-compiled; do tail -1 "$out/$v.txt"; done
