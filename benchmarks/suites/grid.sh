#!/usr/bin/env bash
# The grid suite: the built-in Llama's limits searched against its grids, the wall of a search
# as written, and hand grids against searches of transformers models (issues 10 and 30).
#
#   bash benchmarks/run.sh grid WAIT_S STEP...          (device, .whl carried)
#
# STEPs run in the order given; consecutive steps of one kind run as one batch. Each kind has
# its own folder in what comes back: tuner/ (the limits and ref:SET grids: unpack into
# benchmarks/results/h200-tuner-2026-11-25/), wall/, grid30/ (benchmarks/results/grid30/) and
# contention.jsonl.
#   L1 L2 L3 L4 L5 V B64 L3-s1 VS-L3[:TAG] ...   issue 10's limits (benchmarks/suites/grid-limits.sh)
#   ref:SET                                       a grid of benchmarks.reference (ref:grid, ...)
#   wall:PHASE                                    the wall of studies/llama-1b.toml as written,
#                                                 e.g. wall:0 wall:0,1 wall:0/1 (grid-wall.sh)
#   gpt2m llama1b vit                             issue 30's hand grid against three seeded
#                                                 searches, and their head to head (grid-hand.sh)
#   contention                                    does another GPU's compile slow this GPU's
#                                                 timed steps (benchmarks.contention, GPUs 0-3)
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/run.sh grid WAIT_S STEP... (e.g. 560 L1 L3 VS-L3)" >&2; exit 2; }
kind_of() {
    case $1 in
        wall:*) echo wall ;;
        gpt2m | llama1b | vit) echo hand ;;
        contention) echo contention ;;
        L[1-5] | L[1-5]-* | V | V-* | B64 | VS-* | ref:*) echo limits ;;
        *) echo unknown ;;
    esac
}
for step in "$@"; do
    if [ "$(kind_of "$step")" = unknown ]; then
        echo "grid: unknown step '$step' (L1..L5, V, B64, VS-L3[:TAG], ref:SET, wall:PHASE, gpt2m, llama1b, vit, contention)" >&2
        exit 2
    fi
done
run_batch() {  # a kind, then its steps
    local kind=$1
    shift
    echo "== grid: $kind $*, $(date -u +%FT%TZ)"
    case $kind in
        limits) bash benchmarks/suites/grid-limits.sh "$@" ;;
        wall) bash benchmarks/suites/grid-wall.sh "${@#wall:}" ;;
        hand) bash benchmarks/suites/grid-hand.sh "$@" ;;
        contention) python3 -m benchmarks.contention --out "$BT_OUT/contention.jsonl" ;;
    esac
    echo "== grid: $kind exit $?, $(date -u +%FT%TZ)"
}
batch=()
kind=
for step in "$@"; do
    k=$(kind_of "$step")
    if [ -n "$kind" ] && [ "$k" != "$kind" ]; then run_batch "$kind" "${batch[@]}"; batch=(); fi
    kind=$k
    batch+=("$step")
done
run_batch "$kind" "${batch[@]}"
