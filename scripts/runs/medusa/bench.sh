#!/usr/bin/env bash
# Medusa heads against the training-free token tree and their mix (issue 26): 20 MT-Bench first turns
# (every 4th of 80: all 8 categories) and 20 HumanEval problems (every 8th of 164), 128 new tokens,
# one torch thread, decoders interleaved per prompt after a warm-up, against transformers greedy.
# At equal budgets of 8 tokens fed per step (conf/suite/medusa.yaml): the heads alone (Medusa's tree,
# 7 nodes), the training-free tree (pool + suffix + recycle, decoding=tree at budget 8) and the mix
# (that tree + 8 Medusa nodes). Trains the heads first where they are missing (experiments.tools.medusa;
# resumes). Every run resumes; rerun the script to finish what a session left. MODELS= limits the models.
set -u
cd "$(dirname "$0")/../../.."
models=${MODELS:-smollm2_135m qwen25_coder_05b}
for model in $models; do
    short=$([ "$model" = smollm2_135m ] && echo smollm2 || echo qwen)
    train=(); [ "$model" = qwen25_coder_05b ] && train=(tokens=60000 steps=150)   # as results/medusa was trained
    python -m experiments.tools.medusa model="$model" show=true >/dev/null 2>&1 || \
        python -m experiments.tools.medusa model="$model" "${train[@]}" || exit 1
    for entry in "mtbench 4" "humaneval 8"; do
        set -- $entry
        out=results/medusa/${short}_$1
        python run.py suite=medusa experiment="$1" model="$model" dataset.limit=20 dataset.every="$2" \
            experiment.max_new_tokens=128 threads=1 device=cpu results_dir="$out"
        python -m experiments.reporting.lineup table "$out"
    done
done
