"""Measure the logit noise between a k-row forward and 1-row steps, per dtype (lookahead_core/numerics.py).

    python scripts/logit_noise.py --model smollm2_135m

The same tokens are fed once as one causal chain after nothing, and once as a prefill of the first
half followed by 1-row steps (what greedy decoding does); the largest |logit| difference over the
stepped rows is printed for each dtype, with the logit scale and the smallest top-2 margin.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lookahead_core.layout import causal_layout  # noqa: E402
from lookahead_core.model_io import CausalLM  # noqa: E402
from experiments.models.loader import load_model  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog. Once upon a time there was a little"


def noise(model, tokenizer) -> dict:
    lm = CausalLM(model)
    ids = tokenizer.encode(TEXT)
    half = len(ids) // 2
    offsets, _ = causal_layout(len(ids))
    full = lm.forward(lm.new_cache(), ids, offsets, None, 0, torch.arange(len(ids))).float()
    cache = lm.new_cache()
    rows = [lm.forward(cache, ids[:half], causal_layout(half)[0], None, 0, torch.arange(half)).float()]
    for i in range(half, len(ids)):
        rows.append(lm.forward(cache, ids[i:i + 1], torch.arange(1), None, i, torch.arange(1)).float())
    diff = (full - torch.cat(rows))[half:].abs()
    top2 = full.topk(2, dim=-1).values
    return {"rows": len(ids), "max_diff": float(diff.max()), "logit_scale": float(full.abs().max()),
            "min_top2_margin": float((top2[:, 0] - top2[:, 1]).min())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "float16", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for dtype in args.dtypes:
        model, tokenizer = load_model(args.model, dtype=dtype)
        with torch.inference_mode():
            print(dtype, noise(model, tokenizer), flush=True)


if __name__ == "__main__":
    main()
