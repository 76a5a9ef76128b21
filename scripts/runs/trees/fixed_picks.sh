#!/usr/bin/env bash
# Where auto missed prompt lookup on SmolLM2 XSum, was the pick or the drafts the limit?
# The same 20 prompts as auto_runs.sh, with fixed tree configs beside transformers' prompt lookup:
# the config auto's calibration ranked first among trees, and suffix-only trees (one and four
# matches), the core's own prompt lookup. Resumes. Then the cost model's view of it, with the latency
# curve of auto's calibration on the same machine:
#   python -m experiments.presets.benchmark report --out results/benchmark/trees/fixed_picks_smollm2_xsum \
#       --calibration results/benchmark/trees/auto_smollm2_xsum/rows.auto.json
set -u
cd "$(dirname "$0")/../../.."
trees=(ngram=4,guess=4,pool_only=1,tree=1,suffix=4,depth=6,budget=4
       ngram=4,guess=0,pool_only=1,tree=1,suffix=1,depth=3
       ngram=4,guess=0,pool_only=1,tree=1,suffix=4,depth=6,budget=8)
for entry in "xsum 50"; do   # MBPP ("mbpp 12") not run yet
    set -- $entry
    nice -n 10 python -m experiments.presets.benchmark run --model smollm2_135m --dataset "$1" --limit 20 --every "$2" \
        --max-new-tokens 128 --configs --prompt-lookup 3 --core "${trees[@]}" --threads 1 \
        --out "results/benchmark/trees/fixed_picks_smollm2_$1"
done
