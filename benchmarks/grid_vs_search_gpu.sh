#!/usr/bin/env bash
# Issue 30 on one GPU host: for each workload of benchmarks/grid_vs_search.py (gpt2m, llama1b,
# vit; or those named), its hand grid over every GPU, then one 12-trial search per sampler seed
# (0, 1, 2), the seeds side by side, one GPU each (round robin when there are fewer GPUs).
#
#   bash benchmarks/grid_vs_search_gpu.sh WAIT_S [NAME...]     (device, .whl carried)
#
# The first call starts a detached driver (state in /tmp/bt-grid30, from a copy of benchmarks/
# taken then); every call waits up to WAIT_S seconds and returns $OUT/grid30.tar: the grid
# (grid30.jsonl), the search records (records.jsonl), the pins, the studies (SQLite backups)
# and the logs. The work outlasts one 30-minute lease: put what came back in
# benchmarks/results/grid30/ and the next machine's first call resumes from it (grid points
# and searches already recorded are skipped; a study cut off resumes its trials).
set -uo pipefail
[ $# -ge 1 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/grid_vs_search_gpu.sh WAIT_S [gpt2m llama1b vit]" >&2; exit 2; }
wait_s=$1
shift
names=${*:-gpt2m llama1b vit}
state=/tmp/bt-grid30
kept=benchmarks/results/grid30
mkdir -p "$state/out/pins"

source benchmarks/device_env.sh || exit 1

if bt_needs_driver "$state"; then
    rm -rf "$state/src" && mkdir -p "$state/src" && cp -r benchmarks "$state/src/"
    for f in grid30.jsonl records.jsonl; do
        [ -f "$state/out/$f" ] || cp "$kept/$f" "$state/out/" 2>/dev/null
    done
    for db in "$kept"/*.db; do
        [ -f "$db" ] && [ ! -f "$state/$(basename "$db")" ] && cp "$db" "$state/"
    done
    { date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
      python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
      nproc; } >> "$state/out/device.txt" 2>&1
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
    declare -p PYTHONPATH PYTHONPYCACHEPREFIX | sed 's/^declare -x/export/' > "$state/env.sh"
    cat > "$state/driver.sh" <<EOF
#!/usr/bin/env bash
cd "$state/src"
source "$state/env.sh"
out=$state/out
IFS=, read -ra gpu <<< "$gpus"
for name in $names; do
    echo "== grid \$name, \$(date -u +%FT%TZ)"
    python3 -m benchmarks.grid_vs_search grid \$name --out \$out/grid30.jsonl --gpus $gpus \\
        --stop-after 100000 >> \$out/grid-\$name.txt 2>&1
    i=0
    for seed in 0 1 2; do
        g=\${gpu[\$((i % \${#gpu[@]}))]}; i=\$((i + 1))
        echo "== search \$name seed \$seed on GPU \$g, \$(date -u +%FT%TZ)"
        python3 -m benchmarks.grid_vs_search search \$name --grid \$out/grid30.jsonl \\
            --seed \$seed --storage sqlite:///$state/grid30-\$name-s\$seed.db --pins \$out/pins \\
            --out \$out/records.jsonl --gpus \$g > \$out/search-\$name-s\$seed.txt 2>&1 &
        [ \$i -ge \${#gpu[@]} ] && { wait; i=0; }
    done
    wait
done
python3 -m benchmarks.grid_vs_search report --records \$out/records.jsonl > \$out/report.md 2>&1
echo "== driver done, \$(date -u +%FT%TZ)"
EOF
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
for db in "$state"/*.db; do
    [ -f "$db" ] && bt_sqlite_copy "$db" "$state/out/$(basename "$db")"
done
cp "$state/driver.log" "$state/out/" 2>/dev/null
tar cf "$OUT/grid30.tar" -C "$state/out" .
cat "$state/driver.log"
cat "$state/out/report.md" 2>/dev/null
true
