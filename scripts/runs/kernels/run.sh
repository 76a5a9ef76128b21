#!/usr/bin/env bash
# The kernel's table (docs/cpu_kernels.md, results/kernels/README.md): the README headline's jobs
# (scripts/runs/headline/run.sh: auto, prompt lookup k = 3, the paper's lookahead W15 N5 G15 against
# generate greedy; SmolLM2-135M on 20 items, Qwen2.5-Coder-0.5B on 10, spread over categories, first turns,
# 128 new tokens, one thread, auto's caches empty) on HumanEval with model.linear=both: every decoder twice,
# <name>@stock and <name>@stream, interleaved per item in one job; the baseline is hf_greedy@stock.
# Resumes (pass CACHE= to keep the same calibration cache); ends with the report in results/kernels/report.
# MODELS=, SETS=, DECODERS= and RESULTS= as for the headline (results/kernels_avx2: DECODERS=auto,hf_pld).
cd "$(dirname "$0")/../../.."
SETS=${SETS:-humaneval} RESULTS=${RESULTS:-results/kernels} EXTRA=model.linear=both exec bash scripts/runs/headline/run.sh
