#!/usr/bin/env bash
# auto's pick on SmolLM2 XSum with 6 calibration prompts instead of auto_runs.sh's 2 (items 1-6, none
# of the 20 evaluated ones): does a larger calibration sample see the copying that prompt lookup
# exploits there? The same 20 prompts as auto_runs.sh. Resumes.
set -u
cd "$(dirname "$0")/../../.."
nice -n 10 python -m experiments.presets.benchmark run --model smollm2_135m --dataset xsum --limit 20 --every 50 \
    --max-new-tokens 128 --configs --pool-only --prompt-lookup --auto --protocol grid --calibration-prompts 6 --threads 1 \
    --out results/benchmark/trees/calib6_smollm2_xsum
