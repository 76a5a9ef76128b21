#!/usr/bin/env bash
# EAGLE against every other drafter (issue 47), conf/suite/eagle.yaml: on MT-Bench first turns and
# Spec-Bench (spread over their categories), HumanEval (every 8th of 164) and MBPP (every 12th of the
# 257 sanitized test tasks): 20 items for SmolLM2, 10 for Qwen2.5-Coder, 128 new tokens, one torch
# thread, decoders interleaved per prompt after a warm-up, against transformers greedy.
# Trains what is missing first: the EAGLE-3 drafter (experiments.tools.eagle, where DRAFTERS= puts it,
# default the cache) and Medusa's heads (as results/medusa trained them). Every stage resumes: rerun the
# script to finish what a session left. MODELS= and SETS= limit the models and sets.
set -u
cd "$(dirname "$0")/../../.."
models=${MODELS:-smollm2_135m qwen25_coder_05b}
sets=${SETS:-mtbench humaneval mbpp specbench}
for model in $models; do
    short=$([ "$model" = smollm2_135m ] && echo smollm2 || echo qwen)
    limit=$([ "$model" = smollm2_135m ] && echo 20 || echo 10)
    eagle=(tokens=120000 steps=1000 eval_every=100 lr=0.001 ce_positions=512 depth=6 draft_vocab=8192)
    # Qwen's drafter, its heads and its four runs fit one 3-hour session of this 2-core CPU (49 + 16 + 97
    # minutes as measured on 2026-12-06, the sets two at a time), on a machine whose caches may not outlive it
    [ "$model" = qwen25_coder_05b ] && eagle=(tokens=60000 steps=300 eval_every=50 lr=0.001 ce_positions=512 \
        depth=6 draft_vocab=8192)
    medusa=(); [ "$model" = qwen25_coder_05b ] && medusa=(tokens=60000 steps=150)
    python -m experiments.tools.eagle model="$model" show=true >/dev/null 2>&1 || \
        python -m experiments.tools.eagle model="$model" "${eagle[@]}" || exit 1
    python -m experiments.tools.medusa model="$model" show=true >/dev/null 2>&1 || \
        python -m experiments.tools.medusa model="$model" "${medusa[@]}" threads=1 || exit 1
    for set in $sets; do
        case $set in
            humaneval) pick=(dataset.every=8) ;;
            mbpp) pick=(dataset.every=12) ;;
            *) pick=(dataset.order=spread) ;;
        esac
        out=results/eagle/${short}_$set
        python run.py suite=eagle experiment="$set" model="$model" dataset.limit="$limit" "${pick[@]}" \
            experiment.max_new_tokens=128 threads=1 device=cpu results_dir="$out" || exit 1
    done
done
python -m experiments.reporting.drafters results/eagle
