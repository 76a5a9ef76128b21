#!/usr/bin/env bash
# The scaling law (issue 25, item 1): S against tokens fed per step for the paper's linear branches at
# W in {2,4,8,16,32,64}, N in {3,5,7}, G = W, with and without the prompt pool, and the token tree
# (pool, window, suffix and recycled drafts) capped at the linear branch's budget 1 + 2W(N-1).
# SmolLM2-135M and Qwen2.5-Coder-0.5B; 20 MT-Bench first turns and 20 HumanEval problems spread over
# categories (seeded); 128 new tokens; greedy; the core's greedy as baseline (every row is checked
# against it). S is deterministic, so any thread count and load give the same S. model.linear=stock: the
# sweep began before the streaming kernel existed (docs/cpu_kernels.md) and stays on one kernel throughout.
# DTYPE= sets model.dtype (default float32). Qwen2.5-Coder-0.5B runs in bfloat16 (DTYPE=bfloat16): on this
# CPU's AMX units a 769-token step costs 1.5 s against 5.4 s in float32 (scripts/kernel_curves.py --dtypes),
# which brings its grid from ~50 to ~15 CPU-hours; its float32 rows at W2 N3 stay beside them as the check
# that the dtype does not move S.
# A bfloat16 row may leave greedy at a near-tie (diff_verdict), never at a confident token.
# DEVICE= sets device (default cpu: device=auto refuses a bfloat16 model when it finds no GPU).
# One model at a time, N by N, smallest step first, so that each run adds whole lines to the fit. Every job
# resumes: rerun the script to go on. MODELS=, SETS=, NS=, WS= limit it. On the 2-core CPU the whole grid is
# about 35 CPU-hours (SmolLM2 in float32 ~20, Qwen in bfloat16 ~15; all in float32 ~70), so it spans
# sessions (one process per core, each on its own model or set: SETS=mtbench and SETS=humaneval side by
# side); on a GPU it takes minutes (see results/scaling/README.md).
# Then: python -m experiments.reporting.scaling results/scaling/mtbench results/scaling/humaneval --out results/scaling/report
set -u
cd "$(dirname "$0")/../../.."
models=${MODELS:-smollm2_135m qwen25_coder_05b}
sets=${SETS:-mtbench humaneval}
ns=${NS:-3 5 7}
ws=${WS:-2 4 8 16 32 64}
for model in $models; do
    for N in $ns; do
        for W in $ws; do
            budget=$((1 + 2 * W * (N - 1)))
            linear="window:$W,ngram:$N,guess:$W"
            decoders="[{use:lookahead,name:w${W}_n${N},$linear},{use:lookahead,name:w${W}_n${N}_pool,$linear,prompt_pool:true}"
            decoders+=",{use:lookahead,name:tree_b${budget}_n${N},$linear,prompt_pool:true,tree:true,budget:$budget,sources:{suffix:4,recycle:4}}]"
            for set in $sets; do
                HF_HUB_OFFLINE=1 python run.py experiment="$set" model="$model" dataset.limit=${LIMIT:-20} \
                    dataset.order=spread dataset.turns=1 experiment.max_new_tokens=${TOKENS:-128} \
                    decoding.temperature=0 experiment.score=false threads=${THREADS:-1} baseline=greedy model.linear=stock \
                    model.dtype=${DTYPE:-float32} device=${DEVICE:-cpu} \
                    "decoders=$decoders" results_dir=${RESULTS:-results/scaling} || exit 1
            done
        done
    done
done
