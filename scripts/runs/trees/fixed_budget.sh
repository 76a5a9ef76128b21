#!/usr/bin/env bash
# Goal 3 again with the budget sized to the linear branches' mean (fixed_runs.sh's trees, capped at
# 40 / 80, fed 35 / 71 tokens a step against the linear branches' 38 / 76): the same trees capped at
# 43 / 86, then the W7 tree at 44, on the same 20 prompts. S is deterministic (greedy, same
# prompts), so collect pairs these trees with the linear branches of fixed_runs.sh's folders.
# Resumes. Then: python -m experiments.presets.benchmark collect results/benchmark/trees
set -u
cd "$(dirname "$0")/../../.."
tree() { echo "ngram=5,window=$1,guess=$1,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=$2"; }
for entry in "mtbench 4" "humaneval 8"; do
    set -- $entry
    common=(--model smollm2_135m --dataset "$1" --limit 20 --every "$2" --max-new-tokens 128
            --configs --pool-only --prompt-lookup --threads 1)
    nice -n 8 python -m experiments.presets.benchmark run "${common[@]}" --core "$(tree 7 43)" "$(tree 15 86)" \
        --out "results/benchmark/trees/fixed_budget_smollm2_$1"
    nice -n 8 python -m experiments.presets.benchmark run "${common[@]}" --core "$(tree 7 44)" \
        --out "results/benchmark/trees/fixed_budget44_smollm2_$1"
done
