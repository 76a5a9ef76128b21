#!/usr/bin/env bash
# decoding=auto (token trees in its grid) against transformers greedy and prompt lookup (k = 3, 10)
# on all six experiments (issue 11, goals 1 and 2): SmolLM2-135M on 20 prompts per set, then
# Qwen2.5-Coder-0.5B on 10. Every run resumes; rerun this script to finish what a session left.
# Optional arguments name the experiments to run (default: all six), so two shells can share the sets;
# MODELS="qwen25_coder_05b" limits the models, and PREFIX names the run folders (default auto: the
# folders of the table in README.md; auto2: the grid with suffix-only trees, from commit "auto's grid
# gains suffix-only trees", the latency curve re-timed when load bends it, and 3 calibration prompts
# instead of 2; CALIBRATION_PROMPTS overrides; auto3: COST_AWARE=1, auto's trees cost-aware, i.e.
# --cost-aware: each step feeds only the nodes that pay on this device; auto4: cost-aware always,
# from commit "auto4": suffix drafts tagged by their measured match length, an unseen depth's
# acceptance guessed from the level above, 16-deep suffix trees in the grid, each calibration
# prompt prefilled once, and calibration decodes as long as the evaluated ones (128 tokens;
# CALIBRATION_TOKENS overrides); auto5: auto4 from commit "auto5": the calibration first surveys
# draft acceptance per (tag, depth) with one wide tree, and every cost-aware decode, calibration
# and evaluated, cuts its steps by those measured rates instead of guesses). Since "auto: one
# protocol" every auto is auto5's (cost-aware, the survey unless acceptance is stored; the
# --cost-aware flag is gone): auto..auto4 reproduce only from the commits
# results/benchmark/trees/README.md names.
# Then: python -m experiments.presets.benchmark collect results/benchmark/trees
set -u
only=" $* "
prefix=${PREFIX:-auto}
calibration=${CALIBRATION_PROMPTS:-$([ "$prefix" = auto ] && echo 2 || echo 3)}
models=${MODELS:-smollm2_135m qwen25_coder_05b}
late=$([ "$prefix" = auto4 ] || [ "$prefix" = auto5 ] && echo 1)
tokens=${CALIBRATION_TOKENS:-$([ -n "$late" ] && echo 128 || echo 64)}
cd "$(dirname "$0")/../../.."
common=(--max-new-tokens 128 --configs --pool-only 3,1 --prompt-lookup 3 10 --auto --protocol grid --calibration-prompts $calibration --calibration-tokens $tokens --threads 1)
# experiment and its --every (evenly spaced items; MT-Bench: 8 categories of 10)
sets=("humaneval 8" "mbpp 12" "mtbench 4" "classeval 5" "cnndm 50" "xsum 50")
for model in $models; do
    limit=$([ "$model" = smollm2_135m ] && echo 20 || echo 10)
    short=$([ "$model" = smollm2_135m ] && echo smollm2 || echo qwen)
    for entry in "${sets[@]}"; do
        set -- $entry
        [ -n "${only// /}" ] && [[ "$only" != *" $1 "* ]] && continue
        every=$([ "$model" = smollm2_135m ] && echo "$2" || echo $(( $2 * 2 )))
        nice -n 5 python -m experiments.presets.benchmark run --model "$model" --dataset "$1" --limit "$limit" --every "$every" \
            "${common[@]}" --out "results/benchmark/trees/${prefix}_${short}_$1"
    done
done
