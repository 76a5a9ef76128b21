#!/usr/bin/env bash
# decoding=auto as users get it, through run.py (issue 28): the default auto (protocol online) against
# transformers prompt lookup (k = 3 and 10) and generate greedy, and, for SmolLM2, auto_grid (protocol=grid),
# on the six experiments x two models of the earlier token-tree runs (git show b8db823:results/benchmark/trees/README.md): SmolLM2-135M on 20 items, Qwen2.5-Coder-0.5B
# on 10, spread over categories (dataset.order=spread: round-robin over categories, seeded), first turns,
# 128 new tokens, greedy (decoding.temperature=0: CNN/DM and XSum sample by default), one torch thread,
# decoders interleaved per item after a warm-up. The calibration cache is this script's own ($CACHE,
# default /tmp/lookahead_auto_cache: outside the repository); auto is listed first, so it prepares
# before auto_grid's survey reaches the acceptance store: it starts cold. Every job resumes; rerun the
# script to finish what a session left. MODELS= and SETS= limit it; GRID=0 leaves auto_grid out; RESULTS= is the
# results folder (default results/auto); LINEAR= sets model.linear (default: the config's, stock; LINEAR=auto for results/auto_stream). Then:
#   python -m experiments.reporting.report results/auto/<set>... --out results/auto/report
set -u
cd "$(dirname "$0")/../../.."
export LOOKAHEAD_CALIBRATION_CACHE=${CACHE:-/tmp/lookahead_auto_cache}
models=${MODELS:-smollm2_135m qwen25_coder_05b}
sets=${SETS:-humaneval mbpp mtbench classeval cnndm xsum}
for model in $models; do
    if [ "$model" = smollm2_135m ] && [ "${GRID:-1}" = 1 ]; then
        limit=20 grid=',{use:auto,name:auto_grid,protocol:grid}'
    elif [ "$model" = smollm2_135m ]; then
        limit=20 grid=''
    else
        limit=10 grid=''
    fi
    for set in $sets; do
        HF_HUB_OFFLINE=1 python run.py experiment="$set" model="$model" dataset.limit="$limit" dataset.order=spread \
            dataset.turns=1 experiment.max_new_tokens=128 decoding.temperature=0 threads=1 baseline=hf_greedy \
            "decoders=[auto,hf_pld,{use:hf_pld,name:hf_pld_k10,k:10}$grid]" results_dir=${RESULTS:-results/auto} \
            ${LINEAR:+model.linear=$LINEAR} || exit 1
    done
done
