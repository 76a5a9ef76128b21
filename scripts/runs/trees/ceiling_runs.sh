#!/usr/bin/env bash
# Goal 2 (issue 11): what limits 1.3x on the three code pairs auto5 missed (SmolLM2 MBPP, Qwen
# HumanEval and MBPP). On the prompts auto5 evaluated, the two widest drafters of auto5's grid fed
# whole (no step costs): the survey tree (pool N5 G7 + 4 suffix matches + 4 recycled successors,
# 16 deep, budget 64) and the Jacobi tree (W7 N5 G7 window with the prompt pool, suffix and recycle,
# 6 deep, budget 56). S and each step's committed tokens are deterministic; `report --calibration`
# with auto5's record of the same pair prices them on that run's latency curve, including the
# "best cut" (every step feeding only the tokens it committed). Resumes (rerun as is). Then:
# python -m experiments.presets.benchmark report --out results/benchmark/trees/ceiling_<pair> \
#     --calibration results/benchmark/trees/auto5_<pair>/rows.auto.json
set -u
cd "$(dirname "$0")/../../.."
survey="window=1,ngram=5,guess=7,pool_only=1,tree=1,suffix=4,recycle=4,depth=16,budget=64"
jacobi="ngram=5,window=7,guess=7,prompt_pool=1,tree=1,suffix=4,recycle=4,depth=6,budget=56"
only=" $* "
# model, short name, experiment, --limit, --every (auto_runs.sh's items)
for entry in "smollm2_135m smollm2 mbpp 20 12" "qwen25_coder_05b qwen humaneval 10 16" "qwen25_coder_05b qwen mbpp 10 24"; do
    set -- $entry
    [ -n "${only// /}" ] && [[ "$only" != *" $2_$3 "* ]] && continue
    nice -n ${NICE:-5} python -m experiments.presets.benchmark run --model "$1" --dataset "$3" --limit "$4" --every "$5" \
        --max-new-tokens 128 --configs --threads 1 --core "$survey" "$jacobi" \
        --out "results/benchmark/trees/ceiling_$2_$3"
done
