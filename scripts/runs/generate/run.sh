#!/usr/bin/env bash
# What the custom_generate route costs (issue 49): the same decode loop reached two ways in one job,
# decode() (core decoders) and model.generate(custom_generate=<repo>/hub) (hf_custom, which pays what a
# user's call pays: transformers loading the folder, the generation config, the wrapper), each for
# the lookahead config W5 N4 G5 with the prompt pool and for the loop without drafts, against generate
# greedy. SmolLM2-135M on 20 HumanEval items spread over categories (seeded), first turns, 128 new
# tokens, one torch thread. Resumes: rerun to finish. Then:
#   python -m experiments.reporting.report results/generate/humaneval --out results/generate/report
set -u
cd "$(dirname "$0")/../../.."
cfg="window:5,ngram:4,guess:5,prompt_pool:true"
HF_HUB_OFFLINE=1 python run.py experiment=humaneval model=smollm2_135m dataset.limit=20 dataset.order=spread \
    dataset.turns=1 experiment.max_new_tokens=128 decoding.temperature=0 threads=1 baseline=hf_greedy \
    "decoders=[{use:lookahead,name:decode_la,$cfg},{use:hf_custom,name:generate_la,$cfg},{use:lookahead,name:decode_greedy,lookahead:false},{use:hf_custom,name:generate_greedy,lookahead:false}]" \
    results_dir=${RESULTS:-results/generate} || exit 1
python -m experiments.reporting.report "${RESULTS:-results/generate}/humaneval" --out "${RESULTS:-results/generate}/report"
