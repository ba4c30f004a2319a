#!/usr/bin/env bash
# Issue 33 on one GPU host: offload searched with recompute, on the built-in Llama (1B shape)
# at a batch where activations dominate the peak.
#
#   bash benchmarks/offload_gpu.sh WAIT_S [BATCH]      (device, .whl carried; BATCH default 32)
#
# 1. The probe (benchmarks/offload_probe.py): which offload mechanisms run on this torch, each
#    variant in its own process, one after the other (its peaks are per process).
# 2. Calibration: `budgettune trial` of the unconstrained baseline (budget 1.0) and full block AC
#    (every block), fused AdamW, expandable segments; their device peaks give the two limits:
#    hi halfway between them, lo 1 % under full block AC's (margin 0 at lo: at or below it).
# 3. One search per limit with offload in the space (--offload-every 0,1,2,
#    --block-ac-policies full,op,op_offload), 16 trials, 3 re-verifications.
# 4. Each pin applied in a fresh training process with the README's lines
#    (benchmarks/pin_in_job.py): its device peak against the pin's.
#
# The first call starts a detached driver (state in /tmp/bt-offload33, from a copy of benchmarks/
# taken then); every call waits up to WAIT_S seconds and returns $OUT/offload33.tar. The work
# outlasts one lease: put what came back in benchmarks/results/offload33/ and the next machine's
# first call resumes from it (the probe, the calibration and finished pins are skipped; a study
# cut off resumes its trials from its database).
set -uo pipefail
[ $# -ge 1 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/offload_gpu.sh WAIT_S [BATCH]" >&2; exit 2; }
wait_s=$1
batch=${2:-32}
state=/tmp/bt-offload33
kept=benchmarks/results/offload33
mkdir -p "$state/out"

source benchmarks/device_env.sh || exit 1

if bt_needs_driver "$state"; then
    rm -rf "$state/src" && mkdir -p "$state/src" && cp -r benchmarks "$state/src/"
    if [ -d "$kept" ]; then
        for f in "$kept"/*; do
            [ -f "$f" ] && [ ! -f "$state/out/$(basename "$f")" ] && cp "$f" "$state/out/"
        done
    fi
    { date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
      python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
      nproc; free -g | head -2; } >> "$state/out/device.txt" 2>&1
    declare -p PYTHONPATH PYTHONPYCACHEPREFIX | sed 's/^declare -x/export/' > "$state/env.sh"
    cat > "$state/driver.sh" <<EOF
#!/usr/bin/env bash
cd "$state/src"
source "$state/env.sh"
out=$state/out
w="-w builtin:llama -o batch_size=$batch --device cuda"
if [ ! -f \$out/probe-none.json ]; then
    for v in none op op-offload-compiled hooks-per-block hooks-whole-compiled; do
        echo "== probe \$v, \$(date -u +%FT%TZ)"
        timeout 400 python3 benchmarks/offload_probe.py \$v --output \$out/probe-\$v.json \\
            > \$out/probe-\$v.txt 2>&1
    done
fi
for base in unconstrained full-ac; do
    [ -f \$out/calibrate-\$base.json ] && continue
    ac=""; [ \$base = full-ac ] && ac="--block-ac-every 1"
    echo "== calibrate \$base, \$(date -u +%FT%TZ)"
    timeout 900 python3 -m budgettune trial \$w \$ac --optimizer-impl fused \\
        --cuda-alloc-conf expandable_segments:True --json --run-dir \$state/calibrate-\$base \\
        > \$out/calibrate-\$base.json 2> \$out/calibrate-\$base.stderr.txt
done
read hi lo <<< "\$(python3 - \$out <<'PY'
import json, sys
peak = lambda n: json.load(open(f"{sys.argv[1]}/calibrate-{n}.json"))["measurement"]["peak_device_bytes"]
full, unconstrained = peak("full-ac"), peak("unconstrained")
print((full + unconstrained) // 2, int(full * 0.99))
PY
)"
echo "limits: hi \$hi bytes, lo \$lo bytes" | tee \$out/limits.txt
for level in hi lo; do
    [ -f \$out/pin-\$level.json ] && continue
    limit=\$hi; margin=0.03; [ \$level = lo ] && { limit=\$lo; margin=0; }
    # a study cut off on an earlier machine resumes: only the trials it still lacks (0: pin)
    left=\$(python3 - \$out/offload33.db offload33-\$level <<'PY'
import sys, pathlib, optuna
db, name = sys.argv[1:]
if not pathlib.Path(db).exists() or name not in optuna.get_all_study_names(f"sqlite:///{db}"):
    print(16)
else:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                    optuna.trial.TrialState.PRUNED))
    print(max(16 - len(done), 0))
PY
)
    echo "== search \$level (\$limit bytes, \$left trials to go), \$(date -u +%FT%TZ)"
    timeout 7200 python3 -m budgettune search \$w --max-mem \${limit}B --margin \$margin \\
        --trials \$left --reverify 3 --offload-every 0,1,2 --block-ac-policies full,op,op_offload \\
        --storage sqlite:///\$out/offload33.db --study offload33-\$level \\
        --runs-dir \$state/runs --output \$out/pin-\$level.json > \$out/search-\$level.txt 2>&1
    echo "search \$level exit \$?"
    python3 -m budgettune show --storage sqlite:///\$out/offload33.db --study offload33-\$level \\
        > \$out/show-\$level.txt 2>&1
done
for level in hi lo; do
    [ -f \$out/pin-\$level.json ] || continue
    echo "== pin \$level in a fresh job, \$(date -u +%FT%TZ)"
    timeout 900 python3 benchmarks/pin_in_job.py --pin \$out/pin-\$level.json \\
        --output \$out/job-\$level.json >> \$out/jobs.txt 2> \$out/job-\$level.stderr.txt
    echo "job \$level exit \$?"
done
echo "== driver done, \$(date -u +%FT%TZ)"
EOF
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
cp "$state/driver.log" "$state/out/" 2>/dev/null
# the study database through SQLite's backup API (the search may be writing it)
tar cf "$OUT/offload33.tar" -C "$state/out" --exclude ./offload33.db --exclude '*.db-wal' \
    --exclude '*.db-shm' .
if [ -f "$state/out/offload33.db" ]; then
    rm -f "$state/copy/offload33.db" && mkdir -p "$state/copy"
    bt_sqlite_copy "$state/out/offload33.db" "$state/copy/offload33.db"
    tar rf "$OUT/offload33.tar" -C "$state/copy" ./offload33.db
fi
cat "$state/driver.log"
true
