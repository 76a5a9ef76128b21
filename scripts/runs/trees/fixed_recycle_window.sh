#!/usr/bin/env bash
# Goal 3 (issue 11): the (5, 7, 7) and (5, 15, 15) trees of fixed_budget.sh at the same budgets (44,
# 86) with recycle_window: every window row keeps its logits, so recycled successors also cover the
# window's guesses (a quarter of the W7 tree's steps had no draft at all). The same 20 prompts a set
# as fixed_runs.sh; trees.md pairs them with the linear branches there. Resumes.
set -u
cd "$(dirname "$0")/../../.."
tree() { echo "ngram=5,window=$1,guess=$1,prompt_pool=1,tree=1,suffix=4,recycle=4,recycle_window=1,depth=6,budget=$2"; }
for entry in "humaneval 8" "mtbench 4"; do
    set -- $entry
    nice -n ${NICE:-8} python -m experiments.presets.benchmark run --model smollm2_135m --dataset "$1" --limit 20 --every "$2" \
        --max-new-tokens 128 --configs --pool-only --prompt-lookup --threads 1 \
        --core "$(tree 7 44)" "$(tree 15 86)" --out "results/benchmark/trees/fixed_rw_smollm2_$1"
done
