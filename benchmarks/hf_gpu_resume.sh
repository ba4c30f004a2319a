python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
D=benchmarks/results/h200-hf-2026-11-24
{ date -u +%FT%TZ; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } > $OUT/device-2.txt 2>&1
GPT2=(-w hf:gpt2 -o n_layer=24 -o n_embd=1024 -o n_head=16 -o batch_size=8 -o seq_len=1024)
s=$(date +%s)
python3 -m budgettune trial "${GPT2[@]}" --device cuda:0 --ac-every 1 --ac-policy full --run-dir /tmp/hf-runs/gpt2-trial-full --json > $OUT/gpt2-trial-ac-full.json 2> $OUT/gpt2-trial-ac-full.stderr.txt
echo "exit $? after $(( $(date +%s) - s )) s" >> $OUT/gpt2-trial-ac-full.stderr.txt
cp /tmp/hf-runs/gpt2-trial-full/trial.log $OUT/gpt2-trial-ac-full.log
cp $D/gpt2-medium-1.db $OUT/gpt2-medium.db
s=$(date +%s)
timeout 470 python3 -m budgettune search "${GPT2[@]}" --device cuda:0 --max-mem 10GB --trials 1 --top-k 1 --reverify 2 --timeout 300 --storage $OUT/gpt2-medium.db --study gpt2-medium --runs-dir /tmp/hf-runs/gpt2-medium --output $OUT/pin-gpt2-medium.json > $OUT/search-gpt2-medium-2.txt 2>&1
echo "exit $? after $(( $(date +%s) - s )) s" >> $OUT/search-gpt2-medium-2.txt
python3 -m budgettune show --storage $OUT/gpt2-medium.db --study gpt2-medium > $OUT/show-gpt2-medium.txt 2>&1
tail -3 $OUT/gpt2-trial-ac-full.stderr.txt; tail -25 $OUT/search-gpt2-medium-2.txt
