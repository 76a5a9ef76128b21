"""Where a decoder's output departs from the greedy baseline, and whether numerics can explain it.

In fp16/bf16 a forward of k rows and one of 1 row run different kernels (other tile shapes, other
accumulation orders), so the same token's logits differ slightly between a lookahead step and a
greedy step. Where the baseline's top two logits are closer than that noise, lookahead may pick the
other one: a ``near_tie``, not a bug. A departure at a position where the baseline was confident
is a ``mismatch``: in fp32 it means lookahead is wrong.

``LOGIT_TOLERANCE`` is the noise allowed per dtype, in logit units. Measured on SmolLM2-135M
(logits up to ~33) on a 2-core CPU (``scripts/logit_noise.py``), the same 18 tokens fed as one
forward and as a 9-token prefill plus 1-row steps gave logits differing by at most 7.3e-5 in fp32,
0.11 in fp16 and 0.72 in bf16 (one ulp
of a logit of 32 is 3.8e-6, 0.031 and 0.25 respectively). The tolerances leave headroom over
these maxima for larger models with longer reductions and for GPU kernels:

- fp32 1e-3: 14x the measured maximum; a fp32 ``mismatch`` above it fails the harness run.
- fp16 0.25: 2.3x the measured maximum, 8 ulp at |logit| 32.
- bf16 1.0: 1.4x the measured maximum, 4 ulp at |logit| 32 (bf16 logits come in steps of 0.125-0.25
  at that size, so margins of 0 and 0.25 are common).

The same table bounds the capability probe (``capability.py``), which compares a branching step with
plain forwards of the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from .inputs import validate_input_ids
from .model_io import CausalLM

LOGIT_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-6,
    torch.float32: 1e-3,
    torch.float16: 0.25,
    torch.bfloat16: 1.0,
}

Verdict = Literal["near_tie", "mismatch"]


def logit_tolerance(dtype: torch.dtype) -> float:
    """The logit noise allowed between a k-row and a 1-row forward in ``dtype`` (see module doc)."""
    try:
        return LOGIT_TOLERANCE[dtype]
    except KeyError:
        raise ValueError(f"no logit tolerance for dtype {dtype}; known: {sorted(map(str, LOGIT_TOLERANCE))}") from None


@dataclass(frozen=True)
class Divergence:
    """The first position where ``tokens`` leave ``baseline_tokens``, and why that may be.

    position: index into the generated tokens (0 = the first new token).
    baseline_token / token: the two tokens there (None where that output had already ended).
    margin: the baseline's top-1 minus top-2 logit at that position (teacher-forced forward).
    tolerance: ``logit_tolerance`` of the model's dtype.
    verdict: ``near_tie`` when margin < tolerance (numerics can flip the argmax), else ``mismatch``.
    """

    position: int
    baseline_token: int | None
    token: int | None
    margin: float
    tolerance: float
    verdict: Verdict


@torch.inference_mode()
def divergence(
    model: torch.nn.Module | CausalLM,
    prompt_ids,
    baseline_tokens: Sequence[int],
    tokens: Sequence[int],
) -> Divergence | None:
    """None when ``tokens`` equal ``baseline_tokens``; else their first difference, judged.

    One forward of ``prompt_ids`` + the baseline tokens before the difference gives the logits that
    predicted the baseline's token there.
    """
    baseline, other = list(baseline_tokens), list(tokens)
    if baseline == other:
        return None
    position = next((i for i, (a, b) in enumerate(zip(baseline, other)) if a != b), min(len(baseline), len(other)))
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    fed = validate_input_ids(validate_input_ids(prompt_ids, lm.vocab_size) + baseline[:position], lm.vocab_size)
    logits = lm.forward(lm.new_cache(), fed, torch.arange(len(fed)), None, 0, torch.tensor([len(fed) - 1]))[0]
    top2 = logits.float().topk(2).values
    margin = float(top2[0] - top2[1])
    tolerance = logit_tolerance(lm.dtype)
    return Divergence(
        position,
        baseline[position] if position < len(baseline) else None,
        other[position] if position < len(other) else None,
        margin,
        tolerance,
        "near_tie" if margin < tolerance else "mismatch",
    )
