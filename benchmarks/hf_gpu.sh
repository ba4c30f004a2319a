#!/usr/bin/env bash
# Issue 9 on a two-GPU H200 host: transformers models through `hf:`, no code written.
#   GPU 0: `budgettune trial` of GPT-2 medium with block AC, op policy; then a search of it.
#   GPU 1: `budgettune trial` of GPT-2 medium with block AC, full; then a search of the
#          Llama-3.2-1B shape.
# Everything lands in $OUT (device.txt, dbs, pins, trial JSON and logs, show output); each
# lane is capped so the whole run stays under 9 minutes.
#   device tool: bash benchmarks/hf_gpu.sh        (needs transformers, e.g. 5.17)
#
# The limits sit between each workload's full-AC and unconstrained peaks, estimated (bf16
# weights, grads and AdamW state; HF's fp32 loss over the logits; ~24 MB/token-layer of saved
# activations), since budgettune has no relative limit:
#   GPT-2 medium, B=8 T=1024: steady ~2.9 GB, unconstrained ~12-14 GB, full AC ~7-8 GB -> 10GB
#   Llama-3.2-1B shape, B=4 T=2048: steady ~9.9 GB, unconstrained ~30-35 GB, full AC ~20-22 GB
#                                   -> 27GB
# Both searches measure those two baselines first; if a limit turns out outside the range
# (`show` prints both peaks), re-run with GPT2_LIMIT=... LLAMA_LIMIT=... set between them.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
GPT2_LIMIT=${GPT2_LIMIT:-10GB}
LLAMA_LIMIT=${LLAMA_LIMIT:-27GB}
TRIALS=${TRIALS:-6}         # ~50 s a trial with inductor; 6 + 4 re-verifications fit 9 min
LANE_S=${LANE_S:-510}       # hard cap per lane
mkdir -p "$OUT"
{
    date -u +%FT%TZ
    nvidia-smi
    python3 -c "import torch, transformers, budgettune; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'budgettune', \
budgettune.__version__)"
} > "$OUT/device.txt" 2>&1

GPT2=(-w hf:gpt2 -o n_layer=24 -o n_embd=1024 -o n_head=16 -o batch_size=8 -o seq_len=1024)
LLAMA=(-w hf:llama -o hidden_size=2048 -o intermediate_size=8192 -o num_hidden_layers=16
    -o num_attention_heads=32 -o num_key_value_heads=8 -o vocab_size=128256
    -o rope_theta=500000.0 -o tie_word_embeddings=true -o max_position_embeddings=131072
    -o batch_size=4 -o seq_len=2048)
SEARCH=(--trials "$TRIALS" --top-k 1 --reverify 2 --timeout 300)

lane() {  # lane GPU POLICY NAME LIMIT WORKLOAD...
    local gpu=$1 policy=$2 name=$3 limit=$4
    shift 4
    local start
    start=$(date +%s)
    python3 -m budgettune trial "${GPT2[@]}" --device "cuda:$gpu" --ac-every 1 \
        --ac-policy "$policy" --run-dir "/tmp/hf-runs/gpt2-trial-$policy" --json \
        > "$OUT/gpt2-trial-ac-$policy.json" 2> "$OUT/gpt2-trial-ac-$policy.stderr.txt"
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$OUT/gpt2-trial-ac-$policy.stderr.txt"
    cp "/tmp/hf-runs/gpt2-trial-$policy/trial.log" "$OUT/gpt2-trial-ac-$policy.log" 2>/dev/null
    start=$(date +%s)
    python3 -m budgettune search "$@" --device "cuda:$gpu" --max-mem "$limit" "${SEARCH[@]}" \
        --storage "$OUT/$name.db" --study "$name" --runs-dir "/tmp/hf-runs/$name" \
        --output "$OUT/pin-$name.json" > "$OUT/search-$name.txt" 2>&1
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$OUT/search-$name.txt"
    python3 -m budgettune show --storage "$OUT/$name.db" --study "$name" \
        > "$OUT/show-$name.txt" 2>&1
}

export -f lane
export OUT TRIALS
# On a one-GPU host run one lane per command: ONLY=gpt2 (GPU 0) or ONLY=llama LLAMA_GPU=0.
ONLY=${ONLY:-}
LLAMA_GPU=${LLAMA_GPU:-1}
echo "lanes: ${ONLY:-both}" >> "$OUT/device.txt"
begin=$(date +%s)
if [ "$ONLY" != llama ]; then
    timeout "$LANE_S" bash -c "$(declare -p GPT2 SEARCH); lane 0 op gpt2-medium $GPT2_LIMIT \
        ${GPT2[*]}" &
fi
if [ "$ONLY" != gpt2 ]; then
    timeout "$LANE_S" bash -c "$(declare -p GPT2 SEARCH); lane $LLAMA_GPU full llama-1b \
        $LLAMA_LIMIT ${LLAMA[*]}" &
fi
wait
echo "total $(( $(date +%s) - begin )) s" >> "$OUT/device.txt"
# A lane cut by the cap still has its study: show it.
for name in gpt2-medium llama-1b; do
    [ -e "$OUT/$name.db" ] || continue
    [ -s "$OUT/show-$name.txt" ] || python3 -m budgettune show --storage "$OUT/$name.db" \
        --study "$name" > "$OUT/show-$name.txt" 2>&1
    find "/tmp/hf-runs/$name" -name trial.log -printf '== %p\n' -exec tail -n 40 {} \; \
        > "$OUT/trial-logs-$name.txt" 2>/dev/null
done
