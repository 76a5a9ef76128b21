#!/usr/bin/env bash
# Goal 3 again with the budget sized to the linear branches' mean (fixed_runs.sh's trees, capped at
# 40 / 80, fed 35 / 71 tokens a step against the linear branches' 38 / 76): the same trees capped at
# 43 / 86, on the same 20 prompts. S is deterministic (greedy, same prompts), so the linear
# branches' S from fixed_runs.sh's folders is the reference. Resumes.
set -u
cd "$(dirname "$0")/../../.."
T7=ngram=5,window=7,guess=7,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=43
T15=ngram=5,window=15,guess=15,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=86
for entry in "mtbench 4" "humaneval 8"; do
    set -- $entry
    nice -n 8 python -m experiments.benchmark run --model smollm2_135m --dataset "$1" --limit 20 --every "$2" \
        --max-new-tokens 128 --configs --pool-only --prompt-lookup --core "$T7" "$T15" \
        --threads 1 --out "results/benchmark/trees/fixed_budget_smollm2_$1"
done
