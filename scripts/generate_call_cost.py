"""The fixed cost of one call through each route to the decode loop, on this machine:

    python scripts/generate_call_cost.py --rounds 100

A tiny random Llama (2 layers, width 64), a 32-token prompt, one new token, lookahead W3 N3 G3,
one torch thread; per round, interleaved: ``decode_batch`` called directly, ``lookahead_core.generate.generate``
called directly, and ``model.generate(custom_generate=<repo>/hub, trust_remote_code=True)``
(transformers locating and loading the folder each call). Prints each route's median milliseconds
after one untimed call of each. results/generate/README.md quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # the harness runs from the clone
from experiments.data.datasets import repo_root  # noqa: E402
from experiments.models.tiny import tiny_random_model  # noqa: E402
from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, decode_batch  # noqa: E402
from lookahead_core.generate import generate  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = tiny_random_model("llama")
    ids = torch.randint(3, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    config, lm = LookaheadConfig(window=3, ngram=3, guess=3), CausalLM(model)
    common = dict(max_new_tokens=1, do_sample=False, eos_token_id=None, pad_token_id=0, lookahead=config)
    routes = {
        "decode_batch": lambda: decode_batch(lm, [ids[0].tolist()], config, DecodeLimits(1, ())),
        "lookahead_core.generate.generate": lambda: generate(model, ids, **common),
        'model.generate(custom_generate="hub")': lambda: model.generate(
            ids, custom_generate=str(repo_root() / "hub"), trust_remote_code=True, **common),
    }
    for call in routes.values():
        call()                                                    # untimed: first-call costs
    seconds: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(args.rounds):
        for name, call in routes.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    medians = {name: 1e3 * statistics.median(times) for name, times in seconds.items()}
    for name, ms in medians.items():
        print(f"{name}: {ms:.2f} ms (median of {args.rounds})")
    return medians


if __name__ == "__main__":
    main()
