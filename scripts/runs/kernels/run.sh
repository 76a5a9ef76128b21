#!/usr/bin/env bash
# The kernel's table (docs/cpu_kernels.md): the README headline's decoders (the default auto, prompt lookup
# hf_pld k = 3, the paper's lookahead W15 N5 G15, generate greedy) each on PyTorch's linear layers and on the
# weight-streaming kernel, in one job per (model, set) on the same items (model.linear=both: every decoder
# twice, <name>@stock and <name>@stream, interleaved per item; the baseline is hf_greedy@stock). SmolLM2-135M
# on 20 HumanEval items and Qwen2.5-Coder-0.5B on 10, spread over categories (seeded), 128 new tokens, greedy,
# one torch thread. auto's caches start empty ($CACHE, default a new folder under /tmp; pass CACHE= to resume
# an interrupted run with the same cache). Every job resumes: rerun the script to finish. Then:
#   python -m experiments.reporting.report results/kernels/humaneval --out results/kernels/report
set -u
cd "$(dirname "$0")/../../.."
export LOOKAHEAD_CALIBRATION_CACHE=${CACHE:-$(mktemp -d /tmp/lookahead_kernels_cache.XXXX)}
echo "calibration cache: $LOOKAHEAD_CALIBRATION_CACHE"
for model in ${MODELS:-smollm2_135m qwen25_coder_05b}; do
    limit=$([ "$model" = smollm2_135m ] && echo 20 || echo 10)
    for set in ${SETS:-humaneval}; do
        HF_HUB_OFFLINE=1 python run.py experiment="$set" model="$model" dataset.limit="$limit" dataset.order=spread \
            dataset.turns=1 experiment.max_new_tokens=128 decoding.temperature=0 threads=1 baseline=hf_greedy \
            'decoders=[auto,hf_pld,lookahead]' model.linear=both results_dir=${RESULTS:-results/kernels} || exit 1
    done
done
python -m experiments.reporting.report "${RESULTS:-results/kernels}/humaneval" --out "${RESULTS:-results/kernels}/report"
