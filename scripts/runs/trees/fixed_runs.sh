#!/usr/bin/env bash
# Fixed (N, W, G) = (5, 7, 7) and (5, 15, 15) with the prompt pool: linear branches against token
# trees with the same window and pool plus suffix matches and recycled successors, cut to a budget
# just under what the linear branches feed (issue 11, goal 3). SmolLM2, 20 prompts spread with
# --every. Every run resumes. Then: python -m experiments.presets.benchmark collect results/benchmark/trees
set -u
cd "$(dirname "$0")/../../.."
T7=ngram=5,window=7,guess=7,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=40
T15=ngram=5,window=15,guess=15,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=80
for entry in "mtbench 4" "humaneval 8"; do
    set -- $entry
    nice -n 8 python -m experiments.presets.benchmark run --model smollm2_135m --dataset "$1" --limit 20 --every "$2" \
        --max-new-tokens 128 --configs 5,7,7 5,15,15 --pool on --pool-only --prompt-lookup --core "$T7" "$T15" \
        --threads 1 --out "results/benchmark/trees/fixed_smollm2_$1"
done
