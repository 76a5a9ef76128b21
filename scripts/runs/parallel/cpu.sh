#!/usr/bin/env bash
# Lookahead parallelism on this 2-core CPU (issue 25): the paper's linear lookahead at W = G in {7, 15, 31},
# N = 5, against the core's greedy in the same job, three ways to spend two cores:
#   p1_t1: one process, one thread;  p1_t2: one process, two threads (intra-op);  p2_t1: two processes of one
#   thread each (torchrun, gloo), every step's window columns and candidates split between them.
# SmolLM2-135M, the first turns of 4 MT-Bench and 4 HumanEval items spread over categories, 64 new tokens,
# greedy fp32. Every job resumes: rerun to finish. Run on an otherwise idle machine (the timings are the point).
# Then: OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 -m experiments.tools.parallel \
#           model=smollm2_135m out=results/parallel/cpu/measured.json   (curves, all-gathers: the cost model's input)
#       python -m experiments.reporting.parallel report results/parallel/cpu
set -u
cd "$(dirname "$0")/../../.."
out=${RESULTS:-results/parallel/cpu}
model=${MODEL:-smollm2_135m}
decoders="[{use:lookahead,name:w7,window:7,ngram:5,guess:7},{use:lookahead,name:w15,window:15,ngram:5,guess:15},{use:lookahead,name:w31,window:31,ngram:5,guess:31}]"
for set in ${SETS:-mtbench humaneval}; do
    for setup in p1_t1 p1_t2 p2_t1; do
        threads=${setup#*_t}
        args=(experiment="$set" model="$model" dataset.limit=${LIMIT:-4} dataset.order=spread dataset.turns=1
              experiment.max_new_tokens=${TOKENS:-64} experiment.score=false decoding.temperature=0 baseline=greedy
              threads="$threads" "decoders=$decoders" results_dir="$out/$setup")
        if [ "$setup" = p2_t1 ]; then
            HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 \
                --master-addr 127.0.0.1 --master-port ${PORT:-29561} run.py "${args[@]}" || exit 1
        else
            HF_HUB_OFFLINE=1 python run.py "${args[@]}" || exit 1
        fi
    done
done
