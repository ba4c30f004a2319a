#!/usr/bin/env bash
# The families suite: transformers models through `hf:`, no code written, and sharded searches
# under torchrun with their pins applied in jobs (issues 9, 15, 28 and 45). Two GPUs.
#
#   bash benchmarks/run.sh families WAIT_S STEP...      (device, .whl carried)
#   e.g. bash benchmarks/run.sh families 560 gemma2-2.6b-2gpu-sharded
#
# Steps, in the order given:
#   hf         (issue 9; formerly hf_gpu.sh) GPU 0: `budgettune trial` of GPT-2 medium with block
#              AC, op policy, then a search of it under GPT2_LIMIT (10GB); GPU 1: the same trial
#              with full block AC, then a search of the Llama-3.2-1B shape under LLAMA_LIMIT
#              (27GB); TRIALS (6) trials each, each lane capped at LANE_S (510) seconds. The
#              limits sit between each workload's full-AC and unconstrained peaks (`show`
#              prints both; set the variables between them if one does not).
#   sharded    (issue 15; formerly sharded_gpu.sh) the built-in Llama sharded with FSDP2 under
#              torchrun (2 ranks), studies/llama-2xh200-sharded.toml as written (42 GB
#              allocated per rank, TRIALS=6 trials), `show`, and the pin applied by
#              load_pinned(...).compile on each rank of a torchrun job (benchmarks/pin_in_job.py,
#              per-rank peak vs the pin's, 2 %).
#   llama-pin  (issue 28) the committed sharded pin
#              (benchmarks/results/h100x2-sharded-2026-11-25/pin-sharded.json) in a torchrun job.
#   STUDY      (issues 28 and 45; formerly sharded_family_gpu.sh and hf_sharded_gpu.sh) a sharded
#              search of studies/STUDY.toml: sharded trials (2 ranks) of its workload at budget
#              1.0 and under full block AC, the limit halfway between their per-rank peaks in
#              the study's memory metric; `budgettune search STUDY --gpus 0,1 --max-mem LIMIT`,
#              `show`; its pin under torchrun with the README's lines (benchmarks/pin_in_job.py).
#              e.g. gemma2-2.6b-2gpu-sharded, qwen2-1.5b-2gpu-sharded.
set -uo pipefail
out=${BT_OUT:?run by benchmarks/run.sh}
state=$BT_STATE
[ $# -ge 1 ] || { echo "usage: bash benchmarks/run.sh families WAIT_S STEP... (hf, sharded, llama-pin, STUDY)" >&2; exit 2; }
for step in "$@"; do
    case $step in
        hf | sharded | llama-pin) ;;
        *) [ -f "studies/$step.toml" ] || { echo "families: unknown step '$step' (hf, sharded, llama-pin, or STUDY of studies/STUDY.toml)" >&2; exit 2; } ;;
    esac
done
export PYTHONUNBUFFERED=1
{ date -u +%FT%TZ; nvidia-smi; python3 -c "import torch, transformers, budgettune; print('torch', torch.__version__, 'transformers', transformers.__version__, 'budgettune', budgettune.__version__)"; nproc; } \
    > "$out/device.txt" 2>&1
# a variable, not a function: `timeout` runs programs, and a bare `torchrun` is one rank
torchrun="python3 -m torch.distributed.run --standalone --nproc-per-node 2"

trial_logs() {  # the tails of the trial logs under the state folder
    mkdir -p "$out/trial-logs"
    for log in "$state"/runs*/*/*/trial.log "$state"/probe-*/trial.log; do
        [ -f "$log" ] && tail -n 60 "$log" > "$out/trial-logs/$(basename "$(dirname "$log")").log"
    done
}

hf_lane() {  # hf_lane GPU POLICY NAME LIMIT WORKLOAD...
    local gpu=$1 policy=$2 name=$3 limit=$4 start
    shift 4
    start=$(date +%s)
    python3 -m budgettune trial "${GPT2[@]}" --device "cuda:$gpu" --ac-every 1 \
        --ac-policy "$policy" --run-dir "$state/hf-runs/gpt2-trial-$policy" --json \
        > "$out/gpt2-trial-ac-$policy.json" 2> "$out/gpt2-trial-ac-$policy.stderr.txt"
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$out/gpt2-trial-ac-$policy.stderr.txt"
    cp "$state/hf-runs/gpt2-trial-$policy/trial.log" "$out/gpt2-trial-ac-$policy.log" 2>/dev/null
    start=$(date +%s)
    python3 -m budgettune search "$@" --device "cuda:$gpu" --max-mem "$limit" "${SEARCH[@]}" \
        --storage "$out/$name.db" --study "$name" --runs-dir "$state/hf-runs/$name" \
        --output "$out/pin-$name.json" > "$out/search-$name.txt" 2>&1
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$out/search-$name.txt"
    python3 -m budgettune show --storage "$out/$name.db" --study "$name" \
        > "$out/show-$name.txt" 2>&1
}
hf() {
    local begin name
    GPT2=(-w hf:gpt2 -o n_layer=24 -o n_embd=1024 -o n_head=16 -o batch_size=8 -o seq_len=1024)
    LLAMA=(-w hf:llama -o hidden_size=2048 -o intermediate_size=8192 -o num_hidden_layers=16
        -o num_attention_heads=32 -o num_key_value_heads=8 -o vocab_size=128256
        -o rope_theta=500000.0 -o tie_word_embeddings=true -o max_position_embeddings=131072
        -o batch_size=4 -o seq_len=2048)
    SEARCH=(--trials "${TRIALS:-6}" --top-k 1 --reverify 2 --timeout 300)
    export -f hf_lane
    export out state
    begin=$(date +%s)
    timeout "${LANE_S:-510}" bash -c "$(declare -p GPT2 SEARCH); hf_lane 0 op gpt2-medium \
        ${GPT2_LIMIT:-10GB} ${GPT2[*]}" &
    timeout "${LANE_S:-510}" bash -c "$(declare -p GPT2 SEARCH); hf_lane 1 full llama-1b \
        ${LLAMA_LIMIT:-27GB} ${LLAMA[*]}" &
    wait
    echo "hf: total $(( $(date +%s) - begin )) s" >> "$out/device.txt"
    # A lane cut by the cap still has its study: show it.
    for name in gpt2-medium llama-1b; do
        [ -e "$out/$name.db" ] || continue
        [ -s "$out/show-$name.txt" ] || python3 -m budgettune show --storage "$out/$name.db" \
            --study "$name" > "$out/show-$name.txt" 2>&1
        find "$state/hf-runs/$name" -name trial.log -printf '== %p\n' -exec tail -n 40 {} \; \
            > "$out/trial-logs-$name.txt" 2>/dev/null
    done
    tail -n 30 "$out"/search-*.txt
}

sharded() {
    local study=llama-2xh200-sharded start
    start=$(date +%s)
    echo "== $study search, $(date -u +%FT%TZ)"
    python3 -m budgettune search studies/$study.toml --gpus 0,1 --nproc-per-node 2 \
        --trials "${TRIALS:-6}" --storage sqlite:///$out/sharded.db --study $study \
        --runs-dir $state/runs-sharded --output $out/pin-sharded.json > $out/search-sharded.txt 2>&1
    echo "exit $? after $(( $(date +%s) - start )) s" >> $out/search-sharded.txt
    python3 -m budgettune show --storage sqlite:///$out/sharded.db --study $study \
        > $out/show-sharded.txt 2>&1
    if [ -f $out/pin-sharded.json ]; then
        echo "== pin check, $(date -u +%FT%TZ)"
        timeout 300 $torchrun benchmarks/pin_in_job.py --pin $out/pin-sharded.json \
            --tolerance 0.02 --output $out/pin-check.json > $out/pin-check.txt 2>&1
        echo "exit $?" >> $out/pin-check.txt
    fi
    tail -n 25 "$out/search-sharded.txt"
}

llama_pin() {
    echo "== llama sharded pin in a torchrun job, $(date -u +%FT%TZ)"
    timeout 400 $torchrun benchmarks/pin_in_job.py \
        --pin benchmarks/results/h100x2-sharded-2026-11-25/pin-sharded.json \
        --output $out/job-llama-sharded.json > $out/job-llama-sharded.txt 2>&1
    echo "exit $?" >> $out/job-llama-sharded.txt
    tail -n 20 $out/job-llama-sharded.txt
}

family() {  # $1: the study (studies/$1.toml)
    local study=$1 workload metric opts probe name limit s0
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
            --nproc-per-node 2 "$@" --json --run-dir $state/probe-$study-$name \
            > $out/probe-$study-$name.json 2> $out/probe-$study-$name.stderr.txt
        echo "probe $name exit $?"
    done
    limit=$(python3 - "$out" "$study" "$metric" <<'PY'
import json, sys
peak = lambda n: json.load(open(f"{sys.argv[1]}/probe-{sys.argv[2]}-{n}.json"))["measurement"][f"peak_{sys.argv[3]}_bytes"]
print(f"{(peak('budget') + peak('fullac')) / 2 / 1e9:.2f}GB")
PY
)
    echo "limit $limit ($metric per rank, halfway)" | tee $out/limit-$study.txt
    echo "== $study search, $(date -u +%FT%TZ)"
    s0=$(date +%s)
    python3 -m budgettune search studies/$study.toml --gpus 0,1 --max-mem "$limit" \
        --storage sqlite:///$out/$study.db --study $study --runs-dir $state/runs-$study \
        --output $out/pin-$study.json > $out/search-$study.txt 2>&1
    echo "exit $? after $(( $(date +%s) - s0 )) s" >> $out/search-$study.txt
    python3 -m budgettune show --storage sqlite:///$out/$study.db --study $study \
        > $out/show-$study.txt 2>&1
    if [ -f $out/pin-$study.json ]; then
        echo "== $study pin in a torchrun job, $(date -u +%FT%TZ)"
        timeout 400 $torchrun benchmarks/pin_in_job.py --pin $out/pin-$study.json \
            --tolerance 0.02 --output $out/job-$study.json > $out/job-$study.txt 2>&1
        echo "exit $?" >> $out/job-$study.txt
    fi
    tail -n 40 $out/search-$study.txt
    tail -n 20 $out/job-$study.txt 2>/dev/null
}

for step in "$@"; do
    start=$(date +%s)
    case $step in
        hf) hf ;;
        sharded) sharded ;;
        llama-pin) llama_pin ;;
        *) family "$step" ;;
    esac
    echo "$step: total $(( $(date +%s) - start )) s" >> "$out/device.txt"
done
trial_logs
true
