#!/usr/bin/env bash
# Issue 15 on a two-GPU host: the built-in Llama sharded with FSDP2 under torchrun (2 ranks),
# B=8 T=2048 per rank, limit 42 GB allocated per rank (studies/llama-2xh200-sharded.toml);
# the study measures unconstrained, full block AC, budget 0.5 and torchtitan's op SAC as
# baselines, then searched budgets; the pin reports its slowdown against full AC and op SAC.
# Then `show`, and the pin applied by load_pinned(...).compile on each rank of a torchrun
# training job (benchmarks/pin_in_job.py), per-rank peak vs the pin's (target 2 %).
# The limit and the batch fit a two-GPU host of 80 GB cards as well as H200s (budget 1.0:
# 49.7 GB allocated per rank). Each trial compiles (~40 s): 6 trials + the baselines + the
# re-verification + the check take about 8-10 minutes, so, like tuner_gpu.sh and wall_gpu.sh,
# the first call starts a detached driver (state in /tmp/bt-sharded) and every call waits up to
# WAIT_S seconds, then brings back what exists so far as one archive, $OUT/sharded.tar (a
# device command returns at most 8 files). Make the next call at once if the driver still
# runs: it lives only while the machine is held.
#
#   bash benchmarks/sharded_gpu.sh WAIT_S        (device, .whl carried; TRIALS=6 by default)
set -uo pipefail
[ $# -eq 1 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/sharded_gpu.sh WAIT_S (e.g. 560)" >&2; exit 2; }
wait_s=$1
state=/tmp/bt-sharded
study=llama-2xh200-sharded
mkdir -p "$state/out"

source benchmarks/device_env.sh || exit 1

if bt_needs_driver "$state"; then
    { date -u +%FT%TZ; nvidia-smi; python3 -c "import torch; print('torch', torch.__version__)"; nproc; } \
        > "$state/out/device.txt" 2>&1
    cat > "$state/driver.sh" <<EOF
#!/usr/bin/env bash
cd "$PWD"
source benchmarks/device_env.sh
start=\$(date +%s)
echo "== search, \$(date -u +%FT%TZ)"
python3 -m budgettune search studies/$study.toml --gpus 0,1 --nproc-per-node 2 \\
    --trials ${TRIALS:-6} --storage sqlite:///$state/sharded.db --study $study \\
    --runs-dir $state/runs --output $state/out/pin-sharded.json > $state/out/search.txt 2>&1
echo "exit \$? after \$(( \$(date +%s) - start )) s" >> $state/out/search.txt
python3 -m budgettune show --storage sqlite:///$state/sharded.db --study $study \\
    > $state/out/show.txt 2>&1
if [ -f $state/out/pin-sharded.json ]; then
    echo "== pin check, \$(date -u +%FT%TZ)"
    timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/pin_in_job.py --pin $state/out/pin-sharded.json --tolerance 0.02 \\
        --output $state/out/pin-check.json > $state/out/pin-check.txt 2>&1
    echo "exit \$?" >> $state/out/pin-check.txt
fi
echo "total \$(( \$(date +%s) - start )) s" >> $state/out/device.txt
echo "== driver done, \$(date -u +%FT%TZ)"
EOF
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
[ -f "$state/sharded.db" ] && bt_sqlite_copy "$state/sharded.db" "$state/out/sharded.db"
cp "$state/driver.log" "$state/out/" 2>/dev/null
tail -n +1 "$state"/runs/*/workers/*.log > "$state/out/workers-logs.txt" 2>/dev/null
mkdir -p "$state/out/trial-logs"
for log in "$state"/runs/"$study"/*/trial.log; do
    [ -f "$log" ] && tail -n 60 "$log" > "$state/out/trial-logs/$(basename "$(dirname "$log")").log"
done
tar cf "$OUT/sharded.tar" -C "$state/out" .
cat "$state/driver.log"
tail -n 25 "$state/out/search.txt" 2>/dev/null
tail -n 20 "$state/out/pin-check.txt" 2>/dev/null
true
