"""One rank of a lookahead-parallelism test (tests/test_parallel.py starts P of these, as torchrun
would: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in the environment).

    python tests/parallel_worker.py OUT.json [--kill-at-step K --kill-rank R] [--timeout S]

Decodes every case of ``CASES`` with a :class:`lookahead_core.parallel.ShardedLM` and writes
rank, tokens per case, the step compression and the communication time to ``OUT.json`` (rank 0:
``OUT.json``; rank r: ``OUT.json.r``). ``--kill-at-step``: rank ``--kill-rank`` SIGKILLs itself
on its K-th forward; the others must stop with a ``ParallelError`` (written as ``error``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.models.tiny import tiny_random_model                       # noqa: E402
from lookahead_core import DecodeLimits, LookaheadConfig, SamplingConfig        # noqa: E402
from lookahead_core.decoder import decode, decode_batch                         # noqa: E402
from lookahead_core import parallel                                             # noqa: E402

NEW = 40
CASES = {
    "window": ("decode", LookaheadConfig(5, 4, 0), None),
    "window_pool": ("decode", LookaheadConfig(6, 4, 6, prompt_pool=True), None),
    "tree": ("decode", LookaheadConfig(5, 5, 8, prompt_pool=True, tree=True,
                                       sources={"suffix": 3, "recycle": 3}), None),
    "tree_budget": ("decode", LookaheadConfig(4, 4, 6, tree=True, sources={"recycle": 4}, recycle_window=True,
                                              budget=20), None),
    "pool_only": ("decode", LookaheadConfig(ngram=4, guess=6, pool_only=True, tree=True, sources={"suffix": 4}), None),
    "batch": ("batch", LookaheadConfig(5, 4, 6, prompt_pool=True, tree=True, sources={"suffix": 2}), None),
    "sampling": ("decode", LookaheadConfig(5, 4, 6, prompt_pool=True), SamplingConfig(temperature=1.0, seed=3)),
}


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    motif = torch.randint(0, vocab, (6,), generator=gen).tolist()
    noise = torch.randint(0, vocab, (30,), generator=gen).tolist()
    return [motif + noise[:12] + motif + noise[12:18], noise[5:20] + motif, motif * 3 + noise[:4]]


def run(case: str, lm) -> dict:
    kind, config, sampling = CASES[case]
    items = prompts(lm.vocab_size)
    limits = DecodeLimits(max_new_tokens=NEW)
    if kind == "batch":
        outs = decode_batch(lm, items, config, limits, sampling)
        return {"tokens": [o.tokens for o in outs], "S": [o.stats.compression for o in outs],
                "comm_s": outs[0].stats.comm_seconds}
    out = decode(lm, items[0], config, limits, sampling)
    return {"tokens": out.tokens, "S": out.stats.compression, "comm_s": out.stats.comm_seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--kill-at-step", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--hang", action="store_true", help="the rank stops (sleeps) instead of dying")
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    parallel.init("gloo", timeout_s=args.timeout)
    rank = int(os.environ["RANK"])
    model = tiny_random_model("llama", seed=1)
    lm = parallel.ShardedLM(model)
    if args.kill_at_step and rank == args.kill_rank:
        forward = lm.forward_batch

        def dying(*a, **k):
            if lm._step + 1 >= args.kill_at_step:
                if args.hang:
                    time.sleep(3600)
                os.kill(os.getpid(), signal.SIGKILL)
            return forward(*a, **k)
        lm.forward_batch = dying
    result: dict = {"rank": rank, "ranks": lm.ranks, "cases": {}}
    started = time.perf_counter()
    try:
        for case in args.cases:
            result["cases"][case] = run(case, lm)
    except parallel.ParallelError as error:
        result["error"] = str(error)
    result["seconds"] = time.perf_counter() - started
    path = Path(args.out if rank == 0 else f"{args.out}.{rank}")
    path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
