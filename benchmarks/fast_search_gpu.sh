#!/usr/bin/env bash
# Issue 44 on a GPU host: the searches before and after, timed from the command to the pin,
# their phase tables, their pins head to head, and the pins in cold jobs.
#
#   bash benchmarks/fast_search_gpu.sh WAIT_S PHASE...        (device; .whl carried)
#
# .whl holds the wheels device_env.sh installs (the project as it is now among them) and
# .whl/before/ a wheel of the project as it was before issue 44 (installed into
# /tmp/site-before, ahead of /tmp/site on the path of the "before" searches). The PHASEs run
# in turn; a phase is TASKs separated by spaces, run at once; a TASK is STEP[+STEP...]@GPUS:
# its steps in turn on those GPUs (CUDA_VISIBLE_DEVICES) and on their share of the host's
# cores (taskset: cores / GPUs per GPU), so tasks beside each other do not take each other's
# CPUs. Steps:
#   probe, check   benchmarks.fork_cuda_probe and benchmarks.fast_search check (trial servers
#                  on CUDA, NVML per process, compile callbacks)
#   l1-before, l1-after      studies/llama-1b.toml at L1 (19.015 GB, 2 % margin), 20 trials,
#                  sampler seed 0, on the task's GPUs (--gpus when more than one); before: the
#                  old code; after: this code with --trials-per-gpu $TRIALS_PER_GPU (default 4,
#                  3 on cards under 100 GB)
#   gpt2m-before, gpt2m-after   GPT-2 medium (hf:gpt2, 24 x 1024, batch 8 x 1024) under
#                  grid30's 10.521 GB, 20 trials, seed 0, likewise
#   gpt2m-regional, gpt2m-mixed   the same GPT-2 medium search with --compile-scopes blocks
#                  (regional compilation wherever it can run) or model,blocks (the search
#                  chooses); vs-gpt2m-scopes: their newest pins and grid30's seed-0 pin head to
#                  head; job-gpt2m-regional, job-gpt2m-mixed: their pins in cold jobs;
#                  gpt2m-mixed-b: the mixed search again (its own study and pin);
#                  vs-gpt2m-mixed: the newest mixed pin against grid30's seed-0 pin
#                  (vs-gpt2m-mixed-b, -c, -probe and job-gpt2m-mixed-b, -c, -probe: that
#                  search's newest pin);
#                  gpt2m-mixed5, vs-gpt2m-mixed5, job-gpt2m-mixed5: the mixed search with
#                  --trials-per-gpu 5 (its 20 trials at once on four GPUs), likewise;
#                  gpt2m-mixed-c: a third mixed search; gpt2m-mixed16, job-gpt2m-mixed16: the
#                  mixed search with TORCHINDUCTOR_COMPILE_THREADS=16 (torch's own count on a
#                  16-core share, as before each trial got its share / trials-per-gpu),
#                  gpt2m-mixed16-b: again
#   gpt2m-mixed8   the mixed search with 8 trials, not 20 (what fits a short device
#                  budget: the early round's cold runs beside the last trials on one GPU)
#   warm           one `budgettune trial` of a tiny GPT-2 (the host's bytecode written before
#                  the first timed search)
#   gpt2m-mixed-probe   the mixed search with benchmarks.partition_probe in every process
#                  (each trial's and fresh run's partition and code, by run folder:
#                  gpt2m-mixed-probe.probe.txt): which programs a configuration's runs compiled
#   determinism    the cache-programs configuration compiled afresh, caches of its own each:
#                  four processes at once (hash seed random, then 0), then one alone twice;
#                  benchmarks.partition_probe records each one's partition and code
#   determinism-greedy   four at once, then one alone, for budget 0.1108 greedy, op AC every
#                  block, as written: in two one-GPU searches (h200-determinism-2026-11-29,
#                  h200-probe-2026-11-29) a cold run of that point (budget 0.1108 / 0.1282)
#                  allocated 8,071,597,056 bytes where its trial allocated 8,879,000,576
#   fork-greedy    that point (its SPEC.json, h200-probe-2026-11-29/greedy-0.1108-SPEC.json)
#                  by benchmarks.fork_program: four runs forked from trial servers at once,
#                  then four new processes at once, caches of their own each, the probe on:
#                  does the way a process starts change its program?
#   startup        NVML's set-up and the CLI's imports, timed in fresh processes
#   cache-programs `budgettune trial` of GPT-2 medium at budget 0.0763, op AC every block, fused
#                  (the 4-GPU mixed5 search's trial 14, 10.09 GB / 51.2 ms cold and 9.18 GB /
#                  56.8 ms in runs sharing the study's caches) twice in caches of its own, then
#                  in caches where budget 1.0 compiled first (Triton's holding its kernels)
#   vs-l1          the newest l1-after pin against the newest l1-before pin (none on this
#                  machine: 2026-11-28's, h200x4-fast-search-2026-11-28/), 3 rounds
#   vs-gpt2m       the newest gpt2m-after pin against grid30's seed-0 pin, 3 rounds
#                  (benchmarks.fast_search versus); vs-gpt2m-run2: run 2's committed pin
#                  (h200-fast-search-2026-11-28/run2) against it
#   job-l1, job-gpt2m, job-gpt2m-run2   benchmarks/pin_in_job.py on that pin, cold caches
#   b46-llama, b46-llama32k   issue 46 on the task's GPU: the built-in Llama (Llama-3.2-1B's
#                  shape, 128256-token vocabulary, 8 x 1024 rows as built) or the same with a
#                  32000-token vocabulary and 4 x 512 rows, global batch 32: budget 1.0 trials
#                  (as given) at the workload's batch and at half of it, accumulating to 32; the
#                  limit halfway between their device peaks (so the workload's own batch does
#                  not fit at budget 1.0 and half of it does); studies/llama-1b.toml searched at
#                  that limit over micro-batches 1..32 (16 trials), then at the workload's own
#                  batch alone (12 trials: issue 46's "b"); the two pins and the batch finder's
#                  point head to head (2 rounds), and the batch pin in a cold job; b46-llama-small:
#                  the same at dim 1024 (16 heads, 4 KV heads, FFN 4096, 32000-token
#                  vocabulary), 2 x 1024 rows as built: a model small enough that one row
#                  leaves the GPU idle, where a larger micro-batch may pay for its recompute
#   numerics       issue 45's GPU checks: tiny GPT-2 with dropout 0.1 and a tiny Mixtral
#                  under budget 1.0, full and op block AC (inductor): loss and grad norm
# A search's study is named STEP-NgpuS (its pin STEP-Ngpu-pin.json). Like wall_gpu.sh: the
# first call starts a detached driver (state in /tmp/bt-fast), every call waits up to WAIT_S
# seconds and brings back fast.tar; make the next call at once.
set -uo pipefail
[ $# -ge 2 ] && [ "$1" -ge 0 ] 2>/dev/null || { echo "usage: bash benchmarks/fast_search_gpu.sh WAIT_S PHASE..." >&2; exit 2; }
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
    {
        echo "#!/usr/bin/env bash"
        echo "cd \"$PWD\""
        echo "source benchmarks/device_env.sh"
        echo "state=$state"
        printf 'phases=('; printf '%q ' "$@"; echo ')'
    } > "$state/driver.sh"
    cat >> "$state/driver.sh" <<'EOF'
host_gpus=$(nvidia-smi -L | wc -l)
per_gpu=$(( $(nproc) / host_gpus ))
card_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
gpt2m=(--workload hf:gpt2 -o n_layer=24 -o n_embd=1024 -o n_head=16 -o batch_size=8
       -o seq_len=1024 --device cuda --max-mem 10.521GB --num-trials 20 --seed 0)
l1=(studies/llama-1b.toml --max-mem 19.015GB --margin 0.02 --num-trials 20 --seed 0)
grid30_s0=benchmarks/results/grid30/pins/grid30-gpt2m-s0-pin.json
run2=benchmarks/results/h200-fast-search-2026-11-28/run2/gpt2m-after-pin.json
# the before search's L1 pin of 2026-11-28 (two H200s), when this machine ran no before search
l1_before=benchmarks/results/h200x4-fast-search-2026-11-28/l1-before-2gpu-pin.json
newest() { ls -t "$state"/out/$1-[0-9]*gpu-pin.json 2>/dev/null | head -n 1; }
search() {  # $1: the step (WORKLOAD-before|after), then the search's arguments
    local step=$1 code=${1#*-} start
    shift
    local n
    n=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | wc -l)
    local name=$step-${n}gpu extra=()
    [ "$n" -gt 1 ] && extra+=(--gpus "$(seq -s, 0 $((n - 1)))")
    if [ "$code" != before ]; then
        local per=${TRIALS_PER_GPU:-4}
        [ "$step" = l1-after ] && [ "$card_mib" -lt 100000 ] && per=${TRIALS_PER_GPU:-3}
        extra+=(--trials-per-gpu "$per")
    fi
    local path=$PYTHONPATH
    [ "$code" = before ] && path=/tmp/site-before:$PYTHONPATH
    echo "== $name on GPUs $CUDA_VISIBLE_DEVICES: $(date -u +%FT%TZ)"
    start=$(date +%s.%N)
    PYTHONPATH=$path python3 -m budgettune.cli search "$@" "${extra[@]}" \
        --storage-url "sqlite:///$state/out/$name.db" --study-name "$name" \
        --runs-dir "$state/runs-$name" --output "$state/out/$name-pin.json" \
        > "$state/out/$name.txt" 2>&1
    local code_=$?
    echo "{\"name\": \"$name\", \"gpus\": \"$CUDA_VISIBLE_DEVICES\", \"cores\": \"$CORES\", \"exit\": $code_, \"command_wall_s\": $(python3 -c "import time; print(round(time.time() - $start, 1))"), \"date\": \"$(date -u +%FT%TZ)\"}" >> "$state/out/walls.jsonl"
    echo "== $name: exit $code_, $(date -u +%FT%TZ)"
    tail -n 3 "$state/out/$name.txt"
}
versus() {  # $1: name, then the pins (the after pin first, then the before pins)
    local name=$1
    shift
    echo "== vs-$name: $*, $(date -u +%FT%TZ)"
    python3 -m benchmarks.fast_search versus --pins "$@" --rounds 3 \
        --out "$state/out/vs-$name.jsonl" --runs-dir "$state/runs-vs-$name" > "$state/out/vs-$name.txt" 2>&1
    tail -n 3 "$state/out/vs-$name.txt"
}
job() {  # $1: name, $2: pin
    echo "== job-$1: $2, $(date -u +%FT%TZ)"
    rm -rf "$state/job-cache-$1"  # cold: compile caches of its own, empty
    TORCHINDUCTOR_CACHE_DIR=$state/job-cache-$1/inductor TRITON_CACHE_DIR=$state/job-cache-$1/triton \
        python3 benchmarks/pin_in_job.py --pin "$2" --output "$state/out/job-$1.json" \
        > "$state/out/job-$1.txt" 2>&1
    echo "== job-$1: exit $?"; tail -n 3 "$state/out/job-$1.txt"
}
trial_json() {  # $1: name, then the trial's arguments
    local name=$1
    shift
    python3 -m budgettune.cli trial "$@" --device cuda --json > "$state/out/numerics-$name.json" \
        2> "$state/out/numerics-$name.err"
    echo "== numerics $name: exit $?"
}
numerics() {
    local gpt=(-w hf:gpt2 -o tiny=true -o keep_dropout=true -o resid_pdrop=0.1 -o embd_pdrop=0.1
               -o attn_pdrop=0.1 -o batch_size=8 -o seq_len=128)
    local moe=(-w hf:mixtral -o tiny=true -o batch_size=4 -o seq_len=128)
    trial_json dropout-budget-1.0 "${gpt[@]}"
    trial_json dropout-full "${gpt[@]}" --block-ac-every 1 --block-ac-policy full
    trial_json dropout-op "${gpt[@]}" --block-ac-every 1 --block-ac-policy op
    trial_json dropout-budget-0.5 "${gpt[@]}" --activation-memory-budget 0.5
    trial_json mixtral-budget-1.0 "${moe[@]}"
    trial_json mixtral-full "${moe[@]}" --block-ac-every 1 --block-ac-policy full
    trial_json mixtral-op "${moe[@]}" --block-ac-every 1 --block-ac-policy op
}
batch_case() {  # $1: llama or llama32k (issue 46)
    local name=$1 global=32 opts own micro
    case $name in
        llama) opts=(-o batch_size=8); own=8; micro=1,2,4,8,16,32 ;;
        llama32k) opts=(-o batch_size=4 -o seq_len=512 -o vocab_size=32000); own=4; micro=1,2,4,8,16,32 ;;
        llama-small) opts=(-o dim=1024 -o n_heads=16 -o n_kv_heads=4 -o ffn_dim=4096
                           -o vocab_size=32000 -o batch_size=2); own=2; micro=1,2,4,8,16,32 ;;
    esac
    local dir=$state/out/b46-$name runs=$state/runs-b46-$name b
    mkdir -p "$dir"
    echo "== b46-$name: probes, $(date -u +%FT%TZ)"
    for b in $own $((own / 2)); do
        python3 -m budgettune.cli trial -w builtin:llama "${opts[@]}" --device cuda \
            --micro-batch "$b" --accum-steps $((global / b)) --json --run-dir "$runs/probe-$b" \
            > "$dir/probe-$b.json" 2> "$dir/probe-$b.err"
        echo "probe $b: exit $?"
    done
    local limit
    limit=$(python3 - "$dir" "$own" <<'PY'
import json, sys
peak = lambda b: json.load(open(f"{sys.argv[1]}/probe-{b}.json"))["measurement"]["peak_device_bytes"]
own = int(sys.argv[2])
print(f"{(peak(own) + peak(own // 2)) / 2 / 1e9:.3f}GB")
PY
)
    echo "limit $limit (device, halfway between budget 1.0 at $own and $((own / 2)))" | tee "$dir/limit.txt"
    [ -n "$limit" ] || return
    local kind
    for kind in batch own; do
        local sizes=$micro trials=16 start
        [ "$kind" = own ] && sizes=$own trials=12
        echo "== b46-$name $kind search, $(date -u +%FT%TZ)"
        start=$(date +%s)
        python3 -m budgettune.cli search studies/llama-1b.toml "${opts[@]}" --max-mem "$limit" \
            --global-batch $global --micro-batches "$sizes" --num-trials $trials --seed 0 \
            --reverify-runs 2 --trials-per-gpu 4 --storage-url "sqlite:///$dir/$kind.db" \
            --study-name "b46-$name-$kind" --runs-dir "$runs/$kind" --output "$dir/$kind-pin.json" \
            > "$dir/$kind.txt" 2>&1
        echo "{\"name\": \"b46-$name-$kind\", \"exit\": $?, \"command_wall_s\": $(( $(date +%s) - start )), \"date\": \"$(date -u +%FT%TZ)\"}" >> "$dir/walls.jsonl"
        python3 -m budgettune.cli show --storage-url "sqlite:///$dir/$kind.db" --study-name "b46-$name-$kind" > "$dir/$kind-show.txt" 2>&1
        tail -n 3 "$dir/$kind.txt"
    done
    [ -f "$dir/batch-pin.json" ] && [ -f "$dir/own-pin.json" ] || return
    echo "== b46-$name versus, $(date -u +%FT%TZ)"
    python3 -m benchmarks.fast_search versus --pins "$dir/batch-pin.json" "$dir/own-pin.json" \
        --finder "sqlite:///$dir/batch.db" "b46-$name-batch" --rounds 2 --out "$dir/versus.jsonl" \
        --runs-dir "$runs/versus" > "$dir/versus.txt" 2>&1
    tail -n 3 "$dir/versus.txt"
    job "b46-$name" "$dir/batch-pin.json"
}
cache_programs() {  # does a configuration compile to another program from others' caches?
    local out=$state/out/cache root=/tmp/bt-cache
    local opts=(--workload hf:gpt2 -o n_layer=24 -o n_embd=1024 -o n_head=16 -o batch_size=8
                -o seq_len=1024 --device cuda --block-ac-every 1 --block-ac-policy op
                --optimizer-impl fused --json)
    rm -rf "$root" && mkdir -p "$out"
    local name dir budget
    for name in own-1:own:0.0763 own-2:own:0.0763 shared-T:shared:1.0 shared:shared:0.0763; do
        IFS=: read -r name dir budget <<< "$name"
        mkdir -p "$root/$dir"
        (cd "$root/$dir" && python3 -m budgettune.cli trial "${opts[@]}" \
            --activation-memory-budget "$budget" --run-dir "runs-$name") \
            > "$out/$name.json" 2> "$out/$name.err"
        echo "== cache $name: exit $?, $(date -u +%FT%TZ)"
    done
}
probe_site() {  # a folder whose sitecustomize puts benchmarks.partition_probe in a process
    mkdir -p /tmp/bt-probe-site
    printf 'import benchmarks.partition_probe as p\np.install()\n' > /tmp/bt-probe-site/sitecustomize.py
}
determinism() {  # STEP ROUNDS KNOB...: one configuration compiled afresh in several processes: one program?
    local out=$state/out/$1 root=/tmp/bt-$1 site=/tmp/bt-probe-site rounds=$2
    shift 2
    local opts=(--workload hf:gpt2 -o n_layer=24 -o n_embd=1024 -o n_head=16 -o batch_size=8
                -o seq_len=1024 --device cuda --block-ac-every 1 --block-ac-policy op "$@" --json)
    rm -rf "$root" && mkdir -p "$out" && probe_site
    local round name seed count i repo=$PWD hs
    # ROUNDS: NAME:HASHSEED:PROCESSES each, the processes of a round at once (as a search's
    # trials on one GPU: their compile workers split)
    for round in $rounds; do
        IFS=: read -r name seed count <<< "$round"
        hs=()
        [ "$seed" = random ] || hs=("PYTHONHASHSEED=$seed")
        for i in $(seq 1 "$count"); do
            mkdir -p "$root/$name-$i"
            (cd "$root/$name-$i" && env "${hs[@]}" \
                PYTHONPATH="$site:$repo:$PYTHONPATH" PARTITION_PROBE_OUT="$out/probe/$name-$i" \
                TORCHINDUCTOR_COMPILE_THREADS=$((per_gpu / count)) \
                python3 -m budgettune.cli trial "${opts[@]}" --run-dir runs) \
                > "$out/$name-$i.json" 2> "$out/$name-$i.err" &
        done
        wait
        echo "== ${out##*/} $name: $(date -u +%FT%TZ)"
    done
    python3 -m benchmarks.partition_probe summarize "$out/probe" > "$out/summary.txt" 2>&1
    python3 - "$out" >> "$out/summary.txt" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        m = json.loads(path.read_text())["measurement"]
        print(path.stem, m["peak_allocated_bytes"], round(m["step_time_ms"], 2), round(m["compile_s"], 1))
    except Exception as exc:
        print(path.stem, "no result:", exc)
PY
    cat "$out/summary.txt"
}
startup() {  # what a search pays before its first trial: NVML's set-up, the CLI's imports
    python3 - > "$state/out/startup.txt" 2>&1 <<'PY'
import subprocess, sys, time
def timed(what, code):
    t = time.time()
    subprocess.run([sys.executable, "-c", code], check=False)
    print(f"{what}: {time.time() - t:.2f} s", flush=True)
subprocess.run(["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv"], check=False)
nvml = "import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCount(); pynvml.nvmlShutdown()"
for i in range(3):
    timed(f"a process: NVML init, count, shutdown ({i + 1})", nvml)
holder = subprocess.Popen([sys.executable, "-c", "import pynvml, time; pynvml.nvmlInit(); time.sleep(30)"])
time.sleep(3)
for i in range(2):
    timed(f"the same while another process holds NVML ({i + 1})", nvml)
holder.kill()
timed("python3 -m budgettune.cli --help", "import runpy, sys; sys.argv = ['budgettune', '--help']; runpy.run_module('budgettune.cli', run_name='__main__')")
timed("import budgettune.study.workers", "import budgettune.study.workers")
PY
    echo "== startup: exit $?"; cat "$state/out/startup.txt"
}
run_step() {
    case $1 in
        probe) python3 -m benchmarks.fork_cuda_probe --out "$state/out/probe.json" \
                   transformers.models.gpt2.modeling_gpt2 transformers.models.llama.modeling_llama \
                   > "$state/out/probe.txt" 2>&1; echo "== probe: exit $?"; cat "$state/out/probe.txt" ;;
        check) python3 -m benchmarks.fast_search check --out "$state/out/check.json" \
                   > "$state/out/check.txt" 2>&1; echo "== check: exit $?" ;;
        l1-before|l1-after) search "$1" "${l1[@]}" ;;
        gpt2m-before|gpt2m-after) search "$1" "${gpt2m[@]}" ;;
        gpt2m-regional) search "$1" "${gpt2m[@]}" --compile-scopes blocks ;;
        gpt2m-mixed|gpt2m-mixed-b|gpt2m-mixed-c) search "$1" "${gpt2m[@]}" --compile-scopes model,blocks ;;
        gpt2m-mixed-probe) probe_site
            PYTHONPATH=/tmp/bt-probe-site:$PWD:$PYTHONPATH PARTITION_PROBE_OUT=$state/out/$1 \
                search "$1" "${gpt2m[@]}" --compile-scopes model,blocks
            python3 -m benchmarks.partition_probe summarize "$state/out/$1" > "$state/out/$1.probe.txt" 2>&1 ;;
        gpt2m-mixed8) search "$1" "${gpt2m[@]:0:${#gpt2m[@]}-4}" --num-trials 8 --seed 0 \
            --compile-scopes model,blocks ;;
        gpt2m-mixed16|gpt2m-mixed16-b) TORCHINDUCTOR_COMPILE_THREADS=16 search "$1" "${gpt2m[@]}" --compile-scopes model,blocks ;;
        warm) trial_json warm -w hf:gpt2 -o tiny=true -o batch_size=8 -o seq_len=128 ;;
        vs-gpt2m-mixed|vs-gpt2m-mixed-[bc]|vs-gpt2m-mixed-probe) versus "${1#vs-}" "$(newest "${1#vs-}")" "$grid30_s0" ;;
        gpt2m-mixed5) TRIALS_PER_GPU=5 search "$1" "${gpt2m[@]}" --compile-scopes model,blocks ;;
        vs-gpt2m-mixed5) versus gpt2m-mixed5 "$(newest gpt2m-mixed5)" "$grid30_s0" ;;
        startup) startup ;;
        cache-programs) cache_programs ;;
        determinism) determinism "$1" "together:random:4 seed0:0:4 alone1:random:1 alone2:random:1" \
            --optimizer-impl fused --activation-memory-budget 0.0763 ;;
        fork-greedy) probe_site
            PYTHONPATH=/tmp/bt-probe-site:$PWD:$PYTHONPATH PARTITION_PROBE_OUT=$state/out/$1/probe \
                TORCHINDUCTOR_COMPILE_THREADS=$((per_gpu / 4)) python3 -m benchmarks.fork_program \
                benchmarks/results/h200-probe-2026-11-29/greedy-0.1108-SPEC.json \
                --out "$state/out/$1" > "$state/out/$1.txt" 2>&1
            python3 -m benchmarks.partition_probe summarize "$state/out/$1/probe" >> "$state/out/$1.txt" 2>&1
            cat "$state/out/$1.txt" ;;
        determinism-greedy) determinism "$1" "together:random:4 alone1:random:1" \
            --optimizer-impl as_written --knapsack-solver greedy --activation-memory-budget 0.1108 ;;
        vs-gpt2m-scopes) versus gpt2m-scopes "$(newest gpt2m-regional)" "$(newest gpt2m-mixed)" "$grid30_s0" ;;
        job-gpt2m-regional|job-gpt2m-mixed|job-gpt2m-mixed-[bc]|job-gpt2m-mixed5|job-gpt2m-mixed16|job-gpt2m-mixed-probe) job "${1#job-}" "$(newest "${1#job-}")" ;;
        vs-l1) before=$(newest l1-before)
               versus l1 "$(newest l1-after)" "${before:-$l1_before}" ;;
        vs-gpt2m) versus gpt2m "$(newest gpt2m-after)" "$grid30_s0" ;;
        vs-gpt2m-run2) versus gpt2m-run2 "$run2" "$grid30_s0" ;;
        job-l1) job l1 "$(newest l1-after)" ;;
        job-gpt2m) job gpt2m "$(newest gpt2m-after)" ;;
        job-gpt2m-run2) job gpt2m-run2 "$run2" ;;
        numerics) numerics ;;
        b46-llama|b46-llama32k|b46-llama-small) batch_case "${1#b46-}" ;;
        *) echo "unknown step $1" ;;
    esac
}
run_task() {  # STEP[+STEP...]@GPUS
    local steps=${1%@*} gpus=${1#*@} cores="" g
    for g in ${gpus//,/ }; do cores+="${cores:+,}$((g * per_gpu))-$(((g + 1) * per_gpu - 1))"; done
    export CUDA_VISIBLE_DEVICES=$gpus CORES=$cores
    taskset -a -c -p "$cores" "$BASHPID" > /dev/null  # this subshell and all it starts
    local step
    for step in ${steps//+/ }; do run_step "$step"; done
}
for phase in "${phases[@]}"; do
    echo "== phase: $phase, $(date -u +%FT%TZ)"
    for task in $phase; do run_task "$task" & done
    wait
done
echo "== driver done"
EOF
    bt_start_driver "$state"
fi

bt_wait_driver "$state" "$wait_s"
cp "$state/driver.log" "$state/out/" 2>/dev/null
for db in "$state"/out/*.db; do  # consistent copies of the studies (WAL mode)
    [ -f "$db" ] && bt_sqlite_copy "$db" "$state/copy-$(basename "$db")"
done
mkdir -p "$state/pack"
rm -rf "$state/pack"/*
cp -r "$state"/out/* "$state/pack/" 2>/dev/null
for db in "$state"/copy-*.db; do [ -f "$db" ] && cp "$db" "$state/pack/${db#$state/copy-}"; done
for db in "$state"/out/b46-*/*.db; do  # issue 46's studies, each in its case's folder
    [ -f "$db" ] && bt_sqlite_copy "$db" "$state/pack/${db#$state/out/}"
done
for runs in "$state"/runs-*; do  # every process's log (phases are in the databases)
    [ -d "$runs" ] && tar czf "$state/pack/logs-$(basename "$runs").tgz" -C "$runs" \
        --exclude='compile-cache' --exclude='cold-caches' --exclude='cache' . 2>/dev/null
done
tar cf "$OUT/fast.tar" -C "$state/pack" .
tail -n 25 "$state/driver.log"
