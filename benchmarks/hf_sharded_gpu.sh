#!/usr/bin/env bash
# Issue 28 on a two-GPU host:
#  1. the committed sharded pin (builtin Llama, h100x2-sharded-2026-11-25/pin-sharded.json)
#     applied under torchrun with the README's lines (benchmarks/pin_in_job.py), each rank's
#     peak against the pin's;
#  2. the issue's failing command, a sharded trial of Qwen2-1.5B's shape (28 layers, B=4 T=2048
#     per rank) at budget 1.0, and full block AC beside it: their per-rank allocated peaks set
#     the limit halfway between them;
#  3. `budgettune search studies/qwen2-1.5b-2gpu-sharded.toml --gpus 0,1` at that limit, `show`,
#     and its pin applied under torchrun (per-rank peak within 2 %).
#
#   bash benchmarks/hf_sharded_gpu.sh WAIT_S     (device, .whl carried)
#
# A detached driver (state /tmp/bt-hfsharded, a copy of benchmarks/ and studies/ taken when it
# starts) runs it; every call waits up to WAIT_S seconds and returns $OUT/hfsharded.tar.
set -uo pipefail
[ $# -eq 1 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/hf_sharded_gpu.sh WAIT_S (e.g. 560)" >&2; exit 2; }
wait_s=$1
state=/tmp/bt-hfsharded
study=qwen2-1.5b-2gpu-sharded
mkdir -p "$state/out"

source benchmarks/device_env.sh || exit 1

if bt_needs_driver "$state"; then
    rm -rf "$state/src" && mkdir -p "$state/src" && cp -r benchmarks studies "$state/src/"
    { date -u +%FT%TZ; nvidia-smi; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } \
        > "$state/out/device.txt" 2>&1
    declare -p PYTHONPATH PYTHONPYCACHEPREFIX | sed 's/^declare -x/export/' > "$state/env.sh"
    cat > "$state/driver.sh" <<'EOF'
#!/usr/bin/env bash
state=/tmp/bt-hfsharded
study=qwen2-1.5b-2gpu-sharded
cd "$state/src"
source "$state/env.sh"
out=$state/out
start=$(date +%s)
# a variable, not a function: `timeout` runs programs, and a bare `torchrun` is one rank
torchrun="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
echo "== llama sharded pin in a torchrun job, $(date -u +%FT%TZ)"
timeout 400 $torchrun benchmarks/pin_in_job.py \
    --pin benchmarks/results/h100x2-sharded-2026-11-25/pin-sharded.json \
    --output $out/job-llama-sharded.json > $out/job-llama-sharded.txt 2>&1
echo "exit $?" >> $out/job-llama-sharded.txt
opts=$(python3 - <<'PY'
import tomllib
doc = tomllib.load(open("studies/qwen2-1.5b-2gpu-sharded.toml", "rb"))
print(" ".join(f"-o {k}={str(v).lower() if isinstance(v, bool) else v}"
               for k, v in doc["workload_options"].items()))
PY
)
for probe in "budget --budget 1.0" "fullac --ac-every 1 --ac-policy full"; do
    set -- $probe
    name=$1; shift
    echo "== qwen2 sharded trial $name, $(date -u +%FT%TZ)"
    timeout 500 python3 -m budgettune trial -w hf:qwen2 $opts --device cuda:0,1 \
        --nproc-per-node 2 "$@" --json --run-dir $state/probe-$name \
        > $out/probe-$name.json 2> $out/probe-$name.stderr.txt
    echo "probe $name exit $?"
done
limit=$(python3 - "$out" <<'PY'
import json, sys
peak = lambda n: json.load(open(f"{sys.argv[1]}/probe-{n}.json"))["measurement"]["peak_allocated_bytes"]
print(f"{(peak('budget') + peak('fullac')) / 2 / 1e9:.1f}GB")
PY
)
echo "limit $limit (allocated per rank, halfway)" | tee $out/limit.txt
echo "== search, $(date -u +%FT%TZ)"
s0=$(date +%s)
python3 -m budgettune search studies/$study.toml --gpus 0,1 --max-mem "$limit" \
    --storage sqlite:///$state/hf.db --study $study --runs-dir $state/runs \
    --output $out/pin-qwen2-sharded.json > $out/search.txt 2>&1
echo "exit $? after $(( $(date +%s) - s0 )) s" >> $out/search.txt
python3 -m budgettune show --storage sqlite:///$state/hf.db --study $study > $out/show.txt 2>&1
if [ -f $out/pin-qwen2-sharded.json ]; then
    echo "== qwen2 pin in a torchrun job, $(date -u +%FT%TZ)"
    timeout 400 $torchrun benchmarks/pin_in_job.py --pin $out/pin-qwen2-sharded.json \
        --tolerance 0.02 --output $out/job-qwen2-sharded.json > $out/job-qwen2-sharded.txt 2>&1
    echo "exit $?" >> $out/job-qwen2-sharded.txt
fi
echo "total $(( $(date +%s) - start )) s" >> $out/device.txt
echo "== driver done, $(date -u +%FT%TZ)"
EOF
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
[ -f "$state/hf.db" ] && bt_sqlite_copy "$state/hf.db" "$state/out/hf.db"
cp "$state/driver.log" "$state/out/" 2>/dev/null
mkdir -p "$state/out/trial-logs"
for log in "$state"/runs/*/*/trial.log "$state"/probe-*/trial.log; do
    [ -f "$log" ] && tail -n 60 "$log" > "$state/out/trial-logs/$(basename "$(dirname "$log")").log"
done
tar cf "$OUT/hfsharded.tar" -C "$state/out" .
cat "$state/driver.log"
tail -n 30 "$state/out/search.txt" 2>/dev/null
cat "$state/out/job-"*.txt 2>/dev/null | tail -n 20
true
