#!/usr/bin/env bash
# Issue 44 on a GPU host: the searches before and after, timed from the command to the pin,
# their phase tables, their pins head to head, and the pin in a cold job.
#
#   bash benchmarks/fast_search_gpu.sh WAIT_S JOB...        (device; .whl carried)
#
# .whl holds the wheels device_env.sh installs (the project as it is now among them) and
# .whl/before/ a wheel of the project as it was before issue 44 (installed into
# /tmp/site-before, ahead of /tmp/site on the path of the "before" jobs). JOBs, run in turn
# on GPU 0 (CUDA_VISIBLE_DEVICES=0; one GPU is what the issue times):
#   check         benchmarks.fast_search check (trial server on CUDA, NVML per process, ...)
#   l1-before     studies/llama-1b.toml at L1 (19.015 GB, 2 % margin), 20 trials, old code
#   l1-after      the same, this code, --trials-per-gpu $TRIALS_PER_GPU (default 3)
#   gpt2m-before  GPT-2 medium (hf:gpt2, 24 x 1024, batch 8 x 1024) under grid30's 10.521 GB,
#                 20 trials, old code
#   gpt2m-after   the same, this code, --trials-per-gpu $TRIALS_PER_GPU (default 3)
#   vs-l1 / vs-gpt2m   the after pin against the before pin (or, without one, grid30's seed-0
#                 pin), 3 rounds (benchmarks.fast_search versus)
#   job-l1 / job-gpt2m  benchmarks/pin_in_job.py on the after pin, cold compile caches
# Like wall_gpu.sh: the first call starts a detached driver (state in /tmp/bt-fast), every call
# waits up to WAIT_S seconds and brings back fast.tar; make the next call at once.
set -uo pipefail
[ $# -ge 2 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/fast_search_gpu.sh WAIT_S JOB..." >&2; exit 2; }
wait_s=$1
shift
state=/tmp/bt-fast
mkdir -p "$state/out"

source benchmarks/device_env.sh || exit 1
if [ ! -f /tmp/site-before/.bt-installed ] && ls .whl/before/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site-before .whl/before/*.whl && touch /tmp/site-before/.bt-installed
fi

if bt_needs_driver "$state"; then
    {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        date -u +%FT%TZ
        python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
        nproc
    } > "$state/out/device.txt" 2>&1
    cat > "$state/driver.sh" <<EOF
#!/usr/bin/env bash
cd "$PWD"
source benchmarks/device_env.sh
export CUDA_VISIBLE_DEVICES=0
state=$state
EOF
    cat >> "$state/driver.sh" <<'EOF'
gpt2m=(--workload hf:gpt2 -o n_layer=24 -o n_embd=1024 -o n_head=16 -o batch_size=8
       -o seq_len=1024 --device cuda --max-mem 10.521GB --num-trials 20 --seed 0)
l1=(studies/llama-1b.toml --max-mem 19.015GB --margin 0.02 --num-trials 20 --seed 0)
search() {  # $1: name, $2: before|after, then the search's arguments
    local name=$1 code=$2 start
    shift 2
    local extra=()
    [ "$code" = after ] && extra=(--trials-per-gpu "${TRIALS_PER_GPU:-3}")
    local path=$PYTHONPATH
    [ "$code" = before ] && path=/tmp/site-before:$PYTHONPATH
    echo "== $name: $(date -u +%FT%TZ)"
    start=$(date +%s.%N)
    PYTHONPATH=$path python3 -m budgettune.cli search "$@" "${extra[@]}" \
        --storage-url "sqlite:///$state/out/$name.db" --study-name "$name" \
        --runs-dir "$state/runs-$name" --output "$state/out/$name-pin.json" \
        > "$state/out/$name.txt" 2>&1
    local code_=$?
    echo "{\"name\": \"$name\", \"exit\": $code_, \"command_wall_s\": $(python3 -c "import time; print(round(time.time() - $start, 1))"), \"date\": \"$(date -u +%FT%TZ)\"}" >> "$state/out/walls.jsonl"
    echo "== $name: exit $code_, $(date -u +%FT%TZ)"
    tail -n 3 "$state/out/$name.txt"
}
versus() {  # $1: name, $2: the after pin, $3: the before pin
    echo "== vs-$1: $(date -u +%FT%TZ)"
    python3 -m benchmarks.fast_search versus --pins "$2" "$3" --rounds 3 \
        --out "$state/out/vs-$1.jsonl" --runs-dir "$state/runs-vs-$1" > "$state/out/vs-$1.txt" 2>&1
    tail -n 2 "$state/out/vs-$1.txt"
}
job() {  # $1: name, $2: pin
    echo "== job-$1: $(date -u +%FT%TZ)"
    python3 benchmarks/pin_in_job.py --pin "$2" --output "$state/out/job-$1.json" \
        > "$state/out/job-$1.txt" 2>&1
    echo "== job-$1: exit $?"; tail -n 3 "$state/out/job-$1.txt"
}
before_pin() {  # the before search's pin, else grid30's seed-0 pin of that workload
    if [ -f "$state/out/$1-before-pin.json" ]; then echo "$state/out/$1-before-pin.json"
    else echo "benchmarks/results/grid30/pins/$2"; fi
}
for step in "$@"; do
    case $step in
        check) python3 -m benchmarks.fast_search check --out "$state/out/check.json" \
                   > "$state/out/check.txt" 2>&1; echo "== check: exit $?" ;;
        l1-before|l1-after) search "$step" "${step#l1-}" "${l1[@]}" ;;
        gpt2m-before|gpt2m-after) search "$step" "${step#gpt2m-}" "${gpt2m[@]}" ;;
        vs-l1) versus l1 "$state/out/l1-after-pin.json" "$(before_pin l1 none)" ;;
        vs-gpt2m) versus gpt2m "$state/out/gpt2m-after-pin.json" \
                      "$(before_pin gpt2m grid30-gpt2m-s0-pin.json)" ;;
        job-l1) job l1 "$state/out/l1-after-pin.json" ;;
        job-gpt2m) job gpt2m "$state/out/gpt2m-after-pin.json" ;;
        *) echo "unknown job $step" ;;
    esac
done
echo "== driver done"
EOF
    sed -i "s|^for step in \"\$@\"; do|for step in $*; do|" "$state/driver.sh"
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
cp "$state/driver.log" "$state/out/" 2>/dev/null
for db in "$state"/out/*.db; do  # consistent copies of the studies (WAL mode)
    [ -f "$db" ] && bt_sqlite_copy "$db" "$state/copy-$(basename "$db")"
done
mkdir -p "$state/pack"
rm -rf "$state/pack"/*
cp "$state"/out/* "$state/pack/" 2>/dev/null
for db in "$state"/copy-*.db; do [ -f "$db" ] && cp "$db" "$state/pack/${db#$state/copy-}"; done
for runs in "$state"/runs-*; do  # every process's log (phases are in the databases)
    [ -d "$runs" ] && tar czf "$state/pack/logs-$(basename "$runs").tgz" -C "$runs" \
        --exclude='compile-cache' --exclude='cold-caches' --exclude='cache' . 2>/dev/null
done
tar cf "$OUT/fast.tar" -C "$state/pack" .
tail -n 25 "$state/driver.log"
