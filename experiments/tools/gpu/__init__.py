"""The one GPU command (``python scripts/gpu_run.py``): losslessness, step-time curves and host cost
on random-weight models of the mission's shapes, and a projection of the speedups, in at most 8 files.

    python3 scripts/gpu_run.py --out $OUT             # one GPU (H100 80 GB): at most --budget 450 s
    python3 scripts/gpu_run.py --tiny --out /tmp/gpu   # the same code on tiny shapes on the CPU (tests)

No weights travel: every model is built with random weights on the device, at the published shapes
of Llama-2-7B, Llama-3-8B (GQA, 8 KV heads, vocabulary 128256, rope theta 5e5), Mistral-7B (GQA,
sliding window 4096) and CodeLlama-7B (vocabulary 32016, rope theta 1e6). Imports: torch,
transformers, the standard library, ``lookahead_core`` and the project's stdlib-only helpers
(``experiments.reporting.tables``, ``experiments.rows.provenance``): none of the harness's packages.

(a) correctness: each family at its real width, 2 layers, float32 (TF32 off), under SDPA and
    flex_attention: greedy, lookahead W5 N4 G5 with and without the prompt
    pool, pool-only N4 G4 with a pool the decoder keeps (capacity G, ``keep_pool``) pre-filled with
    the greedy text's n-grams (it must take fewer steps than greedy), token trees (pool-only, and
    lookahead with the pool), Medusa with random heads, an EAGLE-3 drafter with random weights
    (alone, and mixed with the suffix and recycle sources), and ``decode_batch`` of ragged prompts
    (greedy and lookahead): every output is compared with greedy and a difference judged by
    ``lookahead_core.divergence``. A mismatch (a departure at a confident token), a failed probe,
    an error, or a pool that does not cut steps fails the run (exit 1); near-ties are counted.
(b) timing: each mission model at full depth in float16: t(k) of ``CausalLM.forward`` for k = 1..256
    after KV 512 and 2048 (``cost.measure_latency``: wall clock, synchronized on the model's
    device) under SDPA and flex_attention (its compile in the first, untimed round); and the decode loop's cost per step outside the forward for greedy and for steps that
    accept drafts (pool pre-filled with the greedy continuation's n-grams): pool-only N4 G4, the
    paper's W15 N5 G15, auto's widest tree cut with this device's curve, and an EAGLE-3 drafter of the
    shape's width (random weights, every level grown: its forwards are host time here); with host<->device
    copies and synchronizations per step (the profiler's CUDA trace, and ``set_sync_debug_mode``).
(c) projection: the speedup each mission shape would get at the paper's config and at ``auto``,
    and at EAGLE's trees (alone, and mixed with the training-free sources), from S and tokens fed per
    step measured on the CPU with the real offline models and the drafters trained for them (the
    committed rows under results/) and this device's t(k) and host cost. A projection, labelled one.
(d) files, rewritten as each piece finishes (a kill keeps what was done): summary.md, run.json,
    log.txt, correctness.csv, latency.csv, host.csv, projection.csv. A hard budget (``--budget``,
    from the process start) skips what would not fit, with a note, and an alarm stops a piece that
    overruns. The order keeps what matters most: (a), then (b), under SDPA for every model; then
    flex_attention's (a) and (b) model by model, those whose kernels compile first (MHA, then GQA
    with a sliding window), those that reuse them last.

Modules, by job: ``shapes`` (the shapes, the run's sizes, the decoders checked, random models
and drafters), ``checks`` (a), ``timing`` (b), ``projection`` (c), ``report`` (summary.md), ``record``
(the files, rewritten as pieces finish; the budget's clock) and ``main`` (the pieces in order).
"""
