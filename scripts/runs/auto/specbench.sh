#!/usr/bin/env bash
# Spec-Bench with the default auto (issue 28): 10 first turns per category (130 items in the spread order:
# MT-Bench's 8 categories and Spec-Bench's 5 other tasks), SmolLM2-135M, 128 new tokens, one torch thread,
# the default auto (protocol online), transformers prompt lookup (k = 3) against generate
# greedy, interleaved per item after a warm-up. The calibration cache is this script's own ($CACHE, default
# /tmp/lookahead_auto_cache). Resumes; rerun to finish. RESULTS= is the results folder (default results/auto),
# LINEAR= sets model.linear (default: the config's, stock; LINEAR=auto for results/auto_stream). Then:
#   python -m experiments.reporting.report results/auto/specbench --out results/auto/specbench/report
set -u
cd "$(dirname "$0")/../../.."
export LOOKAHEAD_CALIBRATION_CACHE=${CACHE:-/tmp/lookahead_auto_cache}
HF_HUB_OFFLINE=1 python run.py experiment=specbench model=${MODEL:-smollm2_135m} dataset.limit=130 dataset.order=spread \
    dataset.turns=1 experiment.max_new_tokens=128 threads=1 baseline=hf_greedy \
    'decoders=[auto,hf_pld]' results_dir=${RESULTS:-results/auto} ${LINEAR:+model.linear=$LINEAR}
