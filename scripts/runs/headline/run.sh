#!/usr/bin/env bash
# The README's headline: the default auto, transformers' prompt lookup (hf_pld, k = 3), the paper's lookahead
# (decoding=lookahead: W15 N5 G15) against transformers' generate greedy, on the stock stack (PyTorch's
# linear layers, model.linear=stock, the default), one job per (model, set): SmolLM2-135M on 20 items
# and Qwen2.5-Coder-0.5B on 10, of HumanEval and MT-Bench, spread over categories (seeded), first turns,
# 128 new tokens, greedy, one torch thread, decoders interleaved per item after a warm-up. As a new user
# gets it: auto's calibration and acceptance caches start empty ($CACHE, default a folder this script
# makes under /tmp; pass CACHE= to resume an interrupted run with the same cache). Every job resumes:
# rerun the script to finish (EXTRA= adds overrides to every job: scripts/runs/kernels/run.sh; DECODERS=auto,hf_pld
# drops the paper's lookahead, half of a job's time on a CPU). Then:
#   python -m experiments.reporting.report results/headline --out results/headline/report
set -u
cd "$(dirname "$0")/../../.."
export LOOKAHEAD_CALIBRATION_CACHE=${CACHE:-$(mktemp -d /tmp/lookahead_headline_cache.XXXX)}
echo "calibration cache: $LOOKAHEAD_CALIBRATION_CACHE"
for model in ${MODELS:-smollm2_135m qwen25_coder_05b}; do
    limit=$([ "$model" = smollm2_135m ] && echo 20 || echo 10)
    for set in ${SETS:-humaneval mtbench}; do
        HF_HUB_OFFLINE=1 python run.py experiment="$set" model="$model" dataset.limit="$limit" dataset.order=spread \
            dataset.turns=1 experiment.max_new_tokens=128 decoding.temperature=0 threads=1 baseline=hf_greedy \
            "decoders=[${DECODERS:-auto,hf_pld,lookahead}]" ${EXTRA:-} results_dir=${RESULTS:-results/headline} || exit 1
    done
done
python -m experiments.reporting.report "${RESULTS:-results/headline}" --out "${RESULTS:-results/headline}/report"
