#!/usr/bin/env bash
# Throughput against batch size (results/batch): SmolLM2-135M, fp32 on the CPU with PyTorch's linear
# layers (model.linear=stock: the committed rows predate the streaming kernel), one torch thread, the
# conf/suite/batch.yaml lineup (hf_greedy baseline; core_greedy, pool_N3G1, la_N4W5G5_pool, tree_k6)
# on MT-Bench and HumanEval first turns, 128 new tokens, the first 16 prompts in the spread order
# (seed 0), at B = 1 2 4 8 16, the first 2 batches at each B (dataset.limit = min(2, 16 / B) x B).
# t(B, k) first (as the preset measured it before the first job), then one batch at every B (a whole
# curve early), then the rest: the second pass resumes each job's file. The jobs write
# <out>/jobs/<set>_B<B>.csv, the committed files' names, so a rerun resumes them (nothing rerun).
# MODEL=, SETS=, SIZES= limit it; RESULTS= is the folder (default results/batch). Then the views
# (rows.csv, summary.csv, summary.md, speedup_vs_batch.png, roofline.md) are written there.
set -u
cd "$(dirname "$0")/../../.."
out=${RESULTS:-results/batch}
model=${MODEL:-smollm2_135m}
sets=${SETS:-mtbench humaneval}
sizes=${SIZES:-1 2 4 8 16}
prompts=16 batches=2
sizes_list=$(echo $sizes | tr ' ' ',')
HF_HUB_OFFLINE=1 nice -n 10 python -m experiments.tools.batch_latency model="$model" model.linear=stock \
    "batch_sizes=[$sizes_list]" repeats=3 threads=1 out="$out" || exit 1
for pass in first rest; do
    for set in $sets; do
        for B in $sizes; do
            per=$(( prompts / B )); per=$(( per < 1 ? 1 : per )); per=$(( per < batches ? per : batches ))
            limit=$(( per * B < prompts ? per * B : prompts ))
            [ "$pass" = first ] && limit=$(( B < limit ? B : limit ))
            HF_HUB_OFFLINE=1 nice -n 10 python run.py suite=batch model="$model" model.linear=stock experiment="$set" \
                batch_size="$B" dataset.limit="$limit" results_file="$out/jobs/${set}_B${B}.csv" || exit 1
        done
    done
done
python -m experiments.reporting.batch "$out"
python -m experiments.reporting.batch "$out" --roofline
