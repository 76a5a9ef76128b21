#!/usr/bin/env bash
# Medusa heads against the training-free token tree and their mix (issue 26): 20 MT-Bench first turns
# (every 4th of 80: all 8 categories) and 20 HumanEval problems (every 8th of 164), 128 new tokens,
# one torch thread, decoders interleaved per prompt after a warm-up, against transformers greedy.
# At equal budgets of 8 tokens fed per step: the heads alone (Medusa's tree, 7 nodes), the training-free
# tree (pool + suffix + recycle, decoding=tree at budget 8) and the mix (that tree + 8 Medusa nodes).
# Trains the heads first where they are missing (experiments.presets.medusa train; resumes).
# Every run resumes; rerun the script to finish what a session left. MODELS= limits the models.
set -u
cd "$(dirname "$0")/../../.."
models=${MODELS:-smollm2_135m qwen25_coder_05b}
medusa="window=1,ngram=4,guess=0,pool_only=1,tree=1,depth=4,medusa=7"
tree="window=1,ngram=4,guess=4,pool_only=1,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=8"
mixed="$tree,medusa=8"
for model in $models; do
    short=$([ "$model" = smollm2_135m ] && echo smollm2 || echo qwen)
    train=(); [ "$model" = qwen25_coder_05b ] && train=(--tokens 60000 --steps 150)   # as results/medusa was trained
    python -m experiments.presets.medusa show --model "$model" >/dev/null 2>&1 || \
        python -m experiments.presets.medusa train --model "$model" "${train[@]}" || exit 1
    for entry in "mtbench 4" "humaneval 8"; do
        set -- $entry
        python -m experiments.presets.benchmark run --model "$model" --dataset "$1" --limit 20 --every "$2" \
            --max-new-tokens 128 --configs --pool-only --prompt-lookup 3 --core "$medusa" "$tree" "$mixed" \
            --threads 1 --out "results/medusa/${short}_$1"
    done
done
