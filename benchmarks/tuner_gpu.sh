#!/usr/bin/env bash
# Issue 10's tuner searches on one GPU host, longer than one 10-minute device command.
#
#   bash benchmarks/tuner_gpu.sh WAIT_S L1 L2 L4 ... [V] [B64 L5] [L3-s1] [VS-L3[:TAG]]
#                                                                     (device, .whl carried)
#
# (The wall-time figure, W, was a limit here until wall_gpu.sh took it over: `bash
# benchmarks/wall_gpu.sh WAIT_S 0` is the same one-GPU search.) B64 runs
# the reference set b64 (the B=64 grid points; L5 needs its full-AC point), appending to
# llama-b64-h200.jsonl (resumable; copy what came back to benchmarks/results/).
#
# VS-L3 (after L3, say): every pin of L3 the folder holds (its first search's and the searches
# again, `SEARCHED_AGAIN`, with their seeded repeats) and the grid's fastest points under L3,
# head to head (`python -m benchmarks.versus`), one round per GPU at a time, each GPU on its own
# share of the CPUs; appended to versus.jsonl (resumable; its report in versus-L3.md).
# VS-L3:TAG is a new head to head, of the first search's pin and the pins of the searches again
# with that suffix (tuner-L3-TAG-*-pin.json: `L3-s0 L3-s1 L3-s2 VS-L3:edge2`), into
# versus-TAG.jsonl. (Run on 2026-11-27 as VS-L3:seeds, when TAG took every pin of L3.)
#
# L3-s1 is L3's search again with sampler seed 1, in a study and a pin of its own
# (`benchmarks.limits.split_run`): with its siblings, the spread of one limit's search.
#
# The first call starts one detached driver that runs `python -m benchmarks.tuner run L` for each
# limit in turn (20 trials, 5 re-measurements, its own study in one SQLite file), on every GPU the
# host has (`--gpus`). Its state lives in /tmp/bt-tuner. Every call waits up to WAIT_S seconds and
# brings back a consistent copy of the study database (SQLite backup: it is in WAL mode), the
# driver's and the workers' logs, the pins and the records. Make the next call at once: the
# driver survives from one call to the next only while the same machine is held (seen on
# 2026-11-25: it did between two calls, and was gone on each new machine; a lease lasts 30 min).
#
# A call that finds no driver copies the database from benchmarks/results/h200-tuner-2026-11-25/
# (put what came back there first, pins.tar and versus.tar unpacked) and resumes each unfinished
# limit with the trials it still lacks (`--trials 0` once it has 20: only re-verify and pin). A
# trial cut off mid-run is failed and retried by the search; re-verification runs already
# stored count, so only the missing ones run.
set -uo pipefail
[ $# -ge 2 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/tuner_gpu.sh WAIT_S LIMIT... (e.g. 540 B64 L5 L4 L3 V)" >&2; exit 2; }
wait_s=$1
shift
results=benchmarks/results
kept=$results/h200-tuner-2026-11-25
state=/tmp/bt-tuner
mkdir -p "$state"

source benchmarks/device_env.sh || exit 1

# The limits and the grid bests are this kept study's GPU model's figures: a host of another
# model (an H100 lent for an H200) must not add trials to it.
here=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
kept_gpu=$(sed -n 2p "$kept/device.txt" 2>/dev/null | cut -d, -f1)
if [ -n "$kept_gpu" ] && [ "$here" != "$kept_gpu" ]; then
    echo "this host's GPU is $here; the kept study was measured on $kept_gpu: nothing run" >&2
    exit 3
fi

if ! bt_running "$state"; then
    if [ ! -f "$state/tuner.db" ] && [ -f "$kept/tuner.db" ]; then
        cp "$kept/tuner.db" "$state/tuner.db"
        cp "$kept"/tuner-*-pin.json "$kept"/tuner-records.jsonl "$kept"/versus*.jsonl "$state/" \
            2>/dev/null
        cp "$results/llama-b64-h200.jsonl" "$state/" 2>/dev/null
        echo "resuming from $kept/tuner.db" | tee -a "$state/driver.log"
    fi
    # a study kept from an older budgettune: its searches refuse it until it is upgraded (on
    # 2026-11-27 both stopped at once on revision 0002, and a device call was spent)
    [ -f "$state/tuner.db" ] && python3 -m budgettune.cli db upgrade \
        --storage "sqlite:///$state/tuner.db" | tee -a "$state/driver.log"
    [ -f "$state/device.txt" ] || {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        date
        python3 -c "import torch; print(torch.__version__)"
    } > "$state/device.txt" 2>&1
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
    cat > "$state/driver.sh" <<EOF
#!/usr/bin/env bash
# one limit after another; a limit with its pin is done
cd "$PWD"
source benchmarks/device_env.sh
for limit in $*; do
    if [ "\${limit#VS-}" != "\$limit" ]; then  # the head to head of one limit's pins
        l=\${limit#VS-}; tag=\${l#*:}; l=\${l%%:*}  # VS-L3:edge2: into versus-edge2.jsonl
        if [ "\$tag" = "\$l" ]; then out=versus; tag=; else out=versus-\$tag; tag=\$tag-; fi
        pins=\$(ls "$state/tuner-\$l-pin.json" "$state"/tuner-\$l-\$tag*-pin.json 2>/dev/null)
        n=\$(echo $gpus | tr , ' ' | wc -w); rounds=\$((n > 3 ? n : 3))
        echo "== \$limit: \$(echo \$pins | wc -w) pins, \$rounds rounds, GPUs $gpus, \$(date -u +%FT%TZ)"
        i=0
        for g in \$(echo $gpus | tr , ' '); do
            (python3 -m benchmarks.cpu_share \$BASHPID \$i \$n
             python3 -m benchmarks.versus "\$l" \\
                --grid $results/llama-grid-h200.jsonl $results/llama-b8-h200.jsonl \\
                    $results/vit-grid-h200.jsonl \$(ls "$state/llama-b64-h200.jsonl" 2>/dev/null) \\
                --pins \$pins --out "$state/\$out.jsonl" --gpus \$g --rounds \$rounds \\
                --claims "$state/claims-\$l-\$out" > "$state/\$out-\$l-gpu\$g.txt" 2>&1) &
            i=\$((i + 1))
        done
        wait
        cat "$state"/\$out-\$l-gpu*.txt
        python3 -m benchmarks.grid30_final report "$state/\$out.jsonl" > "$state/\$out-\$l.md"
        echo "== \$limit: done \$(date -u +%FT%TZ)"
        continue
    fi
    [ -f "$state/\$(bt_pin_file "\$limit")" ] && continue
    if [ "\$limit" = B64 ]; then  # the B=64 grid points L5 is defined by (resumable)
        echo "== B64: the reference set b64, GPUs $gpus, \$(date -u +%FT%TZ)"
        python3 -m benchmarks.reference --set b64 --out "$state/llama-b64-h200.jsonl" \\
            --gpus "$gpus" --stop-after 1e9
        echo "== B64: exit \$? \$(date -u +%FT%TZ)"
        continue
    fi
    study=\$(python3 -c "import sys; from benchmarks.tuner import study_name; print(study_name(sys.argv[1]))" "\$limit")
    done_n=\$(python3 - "\$study" <<'PY'
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.ERROR)
try:
    study = optuna.load_study(study_name=sys.argv[1], storage="sqlite:///$state/tuner.db")
except Exception:
    print(0)
else:
    print(sum(t.state.is_finished() for t in study.trials))  # not those queued or cut
PY
)
    left=\$((20 - done_n)); [ "\$left" -ge 0 ] || left=0  # 0: only re-verify and pin
    echo "== \$limit (\$study): \$done_n trials done, \$left to run, GPUs $gpus, \$(date -u +%FT%TZ)"
    python3 -m benchmarks.tuner run "\$limit" \\
        --grid $results/llama-grid-h200.jsonl $results/llama-b8-h200.jsonl \\
            $results/vit-grid-h200.jsonl \$(ls "$state/llama-b64-h200.jsonl" 2>/dev/null) \\
        --storage "sqlite:///$state/tuner.db" --pins "$state" \\
        --out "$state/tuner-records.jsonl" --trials "\$left" --reverify 5 --gpus "$gpus"
    echo "== \$limit: exit \$? \$(date -u +%FT%TZ)"
done
echo "== driver done"
EOF
    pinned=yes
    for limit in "$@"; do
        case $limit in
            B64) ;;
            VS-*) grep -q "== $limit: done" "$state/driver.log" 2>/dev/null || pinned=no ;;
            *) [ -f "$state/$(bt_pin_file "$limit")" ] || pinned=no ;;
        esac
    done
    if [ $pinned = yes ] && grep -q "driver done" "$state/driver.log" 2>/dev/null; then
        echo "all pinned"
    else
        bt_start_driver "$state"
    fi
fi

bt_wait_driver "$state" "$wait_s"
bt_sqlite_copy "$state/tuner.db" "$OUT/tuner.db"
cat "$state/device.txt" budgettune-runs/*/workers/*.log "$state"/runs-*/*/workers/*.log \
    > "$OUT/workers.log" 2>/dev/null
cp "$state"/driver.log "$OUT"/ 2>/dev/null
cp "$state"/tuner-records.jsonl "$state"/llama-b64-h200.jsonl "$OUT"/ 2>/dev/null
# the pins travel as one archive, the head-to-head files as another: a device command brings
# back at most 8 files
(cd "$state" && ls tuner-*-pin.json > /dev/null 2>&1 && tar cf "$OUT/pins.tar" tuner-*-pin.json)
(cd "$state" && ls versus*.jsonl > /dev/null 2>&1 && tar cf "$OUT/versus.tar" versus*.jsonl)
tail -n 15 "$state/driver.log"
tail -n 25 "$OUT/workers.log" 2>/dev/null
