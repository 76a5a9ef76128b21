"""``divergence``: where an output departs from greedy, the baseline's top-2 margin there, and a
verdict that tells a numerical near-tie from a real mismatch, per dtype."""

from __future__ import annotations

import pytest
import torch

from lookahead_core import LOGIT_TOLERANCE, DecodeLimits, Divergence, decode, divergence
from experiments.models.tiny import tiny_random_model

PROMPT = [5, 17, 3, 99, 42, 8, 61, 5, 17, 30]
NEW = 24


def margins(model, prompt, tokens):
    """Top-1 minus top-2 logit predicting each generated token (teacher forced), in float32."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1].float()
    top2 = logits.topk(2, dim=-1)
    return top2.values[:, 0] - top2.values[:, 1], top2.indices[:, 1]


def near_tie_model(dtype):
    """A tiny Llama whose lm_head row of token b is 0.98 x that of token a: wherever a wins, b is
    runner-up by 2% of a's logit (tenths of a logit here), a near-tie in bf16 but not in fp32."""
    model = tiny_random_model("llama", seed=2)
    base = decode(model, PROMPT, None, DecodeLimits(max_new_tokens=NEW)).tokens
    a = max(set(base), key=base.count)
    b = next(t for t in range(model.config.vocab_size) if t not in base)
    with torch.no_grad():
        model.lm_head.weight[b] = 0.98 * model.lm_head.weight[a]
    return model.to(dtype), a, b


def test_equal_outputs_have_no_divergence():
    model = tiny_random_model("llama", seed=2)
    tokens = decode(model, PROMPT, None, DecodeLimits(max_new_tokens=NEW)).tokens
    assert divergence(model, PROMPT, tokens, list(tokens)) is None


@pytest.mark.parametrize("dtype,verdict", [(torch.bfloat16, "near_tie"), (torch.float32, "mismatch")])
def test_the_runner_up_at_a_constructed_tie(dtype, verdict):
    model, a, b = near_tie_model(dtype)
    base = decode(model, PROMPT, None, DecodeLimits(max_new_tokens=NEW)).tokens
    at = base.index(a)
    gaps, _ = margins(model, PROMPT, base)
    assert 1e-2 < float(gaps[at]) < 0.9, float(gaps[at])
    swapped = base[:at] + [b] + base[at + 1:]
    found = divergence(model, PROMPT, base, swapped)
    assert found == Divergence(at, a, b, pytest.approx(float(gaps[at]), abs=0.26), LOGIT_TOLERANCE[dtype], verdict)
    assert (found.margin < found.tolerance) == (verdict == "near_tie")


def test_a_wrong_token_at_a_confident_position_is_a_mismatch():
    model = tiny_random_model("llama", seed=2)
    base = decode(model, PROMPT, None, DecodeLimits(max_new_tokens=NEW)).tokens
    gaps, runner_up = margins(model, PROMPT, base)
    at = int(gaps.argmax())
    assert float(gaps[at]) > 1.0
    wrong = base[:at] + [int(runner_up[at])] + [0] * (NEW - at - 1)
    found = divergence(model, PROMPT, base, wrong)
    assert (found.position, found.verdict, found.token) == (at, "mismatch", int(runner_up[at]))
    assert found.margin == pytest.approx(float(gaps[at]), abs=1e-4)
    # The first token, and an output that stops early, are positions too.
    first = divergence(model, PROMPT, base, [int(runner_up[0])] + base[1:])
    assert first.position == 0 and first.margin == pytest.approx(float(gaps[0]), abs=1e-4)
    short = divergence(model, PROMPT, base, base[:5])
    assert (short.position, short.baseline_token, short.token) == (5, base[5], None)

