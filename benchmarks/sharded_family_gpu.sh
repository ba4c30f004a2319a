#!/usr/bin/env bash
# Issue 45 on a two-GPU host: a sharded search of a transformers family the tests do not hold.
#  1. sharded trials (2 ranks) of the study's workload at budget 1.0 and under full block AC:
#     the limit is halfway between their per-rank peaks, in the study's memory metric;
#  2. `budgettune search STUDY --gpus 0,1 --max-mem LIMIT`, then `show`;
#  3. the pin applied under torchrun with the README's lines (benchmarks/pin_in_job.py).
#
#   bash benchmarks/sharded_family_gpu.sh WAIT_S STUDY     (device, .whl carried)
#   e.g. bash benchmarks/sharded_family_gpu.sh 560 gemma2-2.6b-2gpu-sharded
#
# A detached driver (state /tmp/bt-family, a copy of benchmarks/ and studies/ taken when it
# starts) runs it; every call waits up to WAIT_S seconds and returns $OUT/family.tar.
set -uo pipefail
[ $# -eq 2 ] && [ "$1" -ge 0 ] 2>/dev/null && [ -f "studies/$2.toml" ] \
    || { echo "usage: bash benchmarks/sharded_family_gpu.sh WAIT_S STUDY (studies/STUDY.toml)" >&2; exit 2; }
wait_s=$1
state=/tmp/bt-family
mkdir -p "$state/out"

source benchmarks/device_env.sh || exit 1

if bt_needs_driver "$state"; then
    rm -rf "$state/src" && mkdir -p "$state/src" && cp -r benchmarks studies "$state/src/"
    { date -u +%FT%TZ; nvidia-smi; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; nproc; } \
        > "$state/out/device.txt" 2>&1
    declare -p PYTHONPATH PYTHONPYCACHEPREFIX | sed 's/^declare -x/export/' > "$state/env.sh"
    echo "study=$2" >> "$state/env.sh"
    cat > "$state/driver.sh" <<'DRIVER'
#!/usr/bin/env bash
state=/tmp/bt-family
source "$state/env.sh"
cd "$state/src"
out=$state/out
start=$(date +%s)
# a variable, not a function: `timeout` runs programs, and a bare `torchrun` is one rank
torchrun="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
read -r workload metric opts < <(python3 - "studies/$study.toml" <<'PY'
import sys, tomllib
doc = tomllib.load(open(sys.argv[1], "rb"))
opts = " ".join(f"-o {k}={str(v).lower() if isinstance(v, bool) else v}"
                for k, v in doc.get("workload_options", {}).items())
print(doc["workload"], doc.get("mem_metric", "device"), opts)
PY
)
for probe in "budget --activation-memory-budget 1.0" "fullac --block-ac-every 1 --block-ac-policy full"; do
    set -- $probe
    name=$1; shift
    echo "== $study sharded trial $name, $(date -u +%FT%TZ)"
    timeout 500 python3 -m budgettune trial -w "$workload" $opts --device cuda:0,1 \
        --nproc-per-node 2 "$@" --json --run-dir $state/probe-$name \
        > $out/probe-$name.json 2> $out/probe-$name.stderr.txt
    echo "probe $name exit $?"
done
limit=$(python3 - "$out" "$metric" <<'PY'
import json, sys
peak = lambda n: json.load(open(f"{sys.argv[1]}/probe-{n}.json"))["measurement"][f"peak_{sys.argv[2]}_bytes"]
print(f"{(peak('budget') + peak('fullac')) / 2 / 1e9:.2f}GB")
PY
)
echo "limit $limit ($metric per rank, halfway)" | tee $out/limit.txt
echo "== search, $(date -u +%FT%TZ)"
s0=$(date +%s)
python3 -m budgettune search studies/$study.toml --gpus 0,1 --max-mem "$limit" \
    --storage sqlite:///$state/study.db --study $study --runs-dir $state/runs \
    --output $out/pin.json > $out/search.txt 2>&1
echo "exit $? after $(( $(date +%s) - s0 )) s" >> $out/search.txt
python3 -m budgettune show --storage sqlite:///$state/study.db --study $study > $out/show.txt 2>&1
if [ -f $out/pin.json ]; then
    echo "== pin in a torchrun job, $(date -u +%FT%TZ)"
    timeout 400 $torchrun benchmarks/pin_in_job.py --pin $out/pin.json \
        --tolerance 0.02 --output $out/job.json > $out/job.txt 2>&1
    echo "exit $?" >> $out/job.txt
fi
echo "total $(( $(date +%s) - start )) s" >> $out/device.txt
echo "== driver done, $(date -u +%FT%TZ)"
DRIVER
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
[ -f "$state/study.db" ] && bt_sqlite_copy "$state/study.db" "$state/out/study.db"
cp "$state/driver.log" "$state/out/" 2>/dev/null
mkdir -p "$state/out/trial-logs"
for log in "$state"/runs/*/*/trial.log "$state"/probe-*/trial.log; do
    [ -f "$log" ] && tail -n 60 "$log" > "$state/out/trial-logs/$(basename "$(dirname "$log")").log"
done
tar cf "$OUT/family.tar" -C "$state/out" .
cat "$state/driver.log"
tail -n 40 "$state/out/search.txt" 2>/dev/null
tail -n 20 "$state/out/job.txt" 2>/dev/null
true
