#!/usr/bin/env bash
# Issue 9 on one H200: a search of the Llama-3.2-1B shape through hf:, sized for one 10-minute
# device command (4 trials: the three baselines and one sampled; 1 re-verification run each).
#   device tool: bash benchmarks/hf_gpu_llama.sh      (after the .whl install line)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } > $OUT/device-llama.txt 2>&1
LLAMA=(-w hf:llama -o hidden_size=2048 -o intermediate_size=8192 -o num_hidden_layers=16
    -o num_attention_heads=32 -o num_key_value_heads=8 -o vocab_size=128256
    -o rope_theta=500000.0 -o tie_word_embeddings=true -o max_position_embeddings=131072
    -o batch_size=4 -o seq_len=2048)
s=$(date +%s)
timeout ${SEARCH_S:-550} python3 -m budgettune search "${LLAMA[@]}" --device cuda:0 --max-mem ${LLAMA_LIMIT:-27GB} \
    --trials ${TRIALS:-4} --top-k 1 --reverify ${REVERIFY:-1} --timeout 300 --storage $OUT/llama-1b.db \
    --study llama-1b --runs-dir /tmp/hf-runs/llama-1b --output $OUT/pin-llama-1b.json \
    > $OUT/search-llama-1b.txt 2>&1
echo "exit $? after $(( $(date +%s) - s )) s" >> $OUT/search-llama-1b.txt
tail -30 $OUT/search-llama-1b.txt
