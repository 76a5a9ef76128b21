#!/usr/bin/env bash
# Goal 3 (issue 11) in one run per set on today's core: the paper's linear branches at (N, W, G) =
# (5, 7, 7) and (5, 15, 15) with the prompt pool, and beside them in the same run the trees of the
# same window and pool plus 4 suffix matches and 4 recycled successors 6 deep, cut to budgets 44 and
# 86 (the linear branches' mean tokens fed, 38 and 76, plus the walk's slack), with and without
# recycle_window. SmolLM2-135M, 20 prompts a set spread over categories (the items of
# fixed_runs.sh). S and tokens fed are deterministic; speedups are against HF greedy in the run.
# Resumes (rerun as is). PREFIX names the folders (default goal3). Then:
# python -m experiments.presets.benchmark collect results/benchmark/trees   (trees.md pairs each tree with
# the linear twin of its own run)
set -u
prefix=${PREFIX:-goal3}
cd "$(dirname "$0")/../../.."
tree() { echo "ngram=5,window=$1,guess=$1,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=$2${3:-}"; }
for entry in "humaneval 8" "mtbench 4"; do
    set -- $entry
    nice -n ${NICE:-5} python -m experiments.presets.benchmark run --model smollm2_135m --dataset "$1" --limit 20 --every "$2" \
        --max-new-tokens 128 --configs 5,7,7 5,15,15 --pool on --pool-only --prompt-lookup --threads 1 \
        --core "$(tree 7 44)" "$(tree 15 86)" "$(tree 7 44 ,recycle_window=1)" "$(tree 15 86 ,recycle_window=1)" \
        --out "results/benchmark/trees/${prefix}_smollm2_$1"
done
