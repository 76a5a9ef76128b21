#!/usr/bin/env bash
# ClassEval, where prompt lookup k = 10 beat auto on SmolLM2: auto's trees stop at depth 6 (at most 7
# tokens a step), prompt lookup commits up to 11. The same 20 prompts as auto_runs.sh, with auto's
# pick beside deeper suffix trees. Resumes; then collect as for auto_runs.sh.
set -u
cd "$(dirname "$0")/../../.."
trees=(ngram=4,guess=4,pool_only=1,tree=1,suffix=4,depth=6,budget=8
       ngram=4,guess=0,pool_only=1,tree=1,suffix=1,depth=10
       ngram=4,guess=4,pool_only=1,tree=1,suffix=4,depth=10,budget=12
       ngram=4,guess=4,pool_only=1,tree=1,suffix=4,depth=12,budget=16)
nice -n 10 python -m experiments.presets.benchmark run --model smollm2_135m --dataset classeval --limit 20 --every 5 \
    --max-new-tokens 128 --configs --pool-only --prompt-lookup 10 --core "${trees[@]}" --threads 1 \
    --out results/benchmark/trees/fixed_deep_smollm2_classeval
