#!/usr/bin/env bash
# The cost suite (issue 10; formerly fresh_run_cost.sh): where a trial's wall time goes.
#
#   bash benchmarks/run.sh cost WAIT_S                 (device, .whl carried)
#
# Python start-up and torch's imports (as the host has them, then with a bytecode cache in /tmp:
# written by the first, read by the second; `startup.txt` of 2026-11-25 was taken before this
# unset PYTHONDONTWRITEBYTECODE, so its three figures are all without one), then
# `budgettune trial` of the built-in Llama: budget 1.0 twice (cold, then warm compile caches),
# a greedy-solver budget 0.86 (another cache variant: shares only Triton's kernels) and full
# block AC (with the compile caches' log lines, which say why its FX-graph cache is bypassed).
# Each trial log carries timestamped stages: launch, torch imported, workload built, step
# prepared, measured (compile included), the child's end. Everything runs as the host has
# Python (PYTHONDONTWRITEBYTECODE=1, no bytecode cache), as the 2026-11-25 figures were taken,
# not with the cache benchmarks/device_env.sh gives the other suites.
set -uo pipefail
out=${BT_OUT:?run by benchmarks/run.sh}
export PYTHONDONTWRITEBYTECODE=1
unset PYTHONPYCACHEPREFIX
rm -rf /tmp/bt-cost-pycache  # the cache the second import writes and the third reads
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    date -u +%FT%TZ
    python3 -c "import torch; print(torch.__version__)"
    site=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")
    echo "torch at $site; writable: $([ -w "$site" ] && echo yes || echo no);" \
        ".pyc files under torch/_inductor: $(find "$site/_inductor" -name '*.pyc' | wc -l)"
    for prefix in "" /tmp/bt-cost-pycache /tmp/bt-cost-pycache; do
        start=$(date +%s%N)
        if [ -n "$prefix" ]; then  # the hosts set PYTHONDONTWRITEBYTECODE=1: unset it here
            env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$prefix \
                python3 -c "import torch._dynamo, torch._inductor.compile_fx"
        else
            python3 -c "import torch._dynamo, torch._inductor.compile_fx"
        fi
        echo "import torch._dynamo + inductor, bytecode cache '$prefix':" \
            "$(( ($(date +%s%N) - start) / 1000000 )) ms"
    done
} > "$out/startup.txt" 2>&1
cat "$out/startup.txt"
llama="--workload builtin:llama --device cuda --timed-steps 8"
run() {  # name, then trial flags
    local name=$1
    shift
    python3 -m budgettune.cli trial $llama "$@" --run-dir "$BT_STATE/runs/$name" \
        > "$out/$name.out" 2>&1
    cp "$BT_STATE/runs/$name/trial.log" "$out/$name.log"
    grep -h "INFO budgettune" "$out/$name.log" | cut -c12-23,60-200 | grep -v measuring
}
rm -rf budgettune-runs/compile-cache "$BT_STATE/runs"  # `trial` caches there: start cold
run budget-1.0-cold
run budget-1.0-warm
run greedy-0.86 --budget 0.86 --solver greedy --optimizer-impl fused \
    --alloc-conf expandable_segments:True
TORCH_LOGS="+torch._inductor.codecache,+torch._functorch._aot_autograd.autograd_cache" \
    run full-ac --ac-every 1 --optimizer-impl fused
grep -h "Bypass\|bypass" "$out/full-ac.log" | sort | uniq -c | cut -c1-300 | head -5
