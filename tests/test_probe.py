"""The capability probe: every listed family passes, ALiBi-from-indices families are refused with a
clear reason, and what still runs on them (greedy, causal-chain configs) does run and is lossless."""

from __future__ import annotations

import pytest
import torch

from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, UnsupportedModelError, decode, probe
from lookahead_core import capability as probe_module
from experiments.models.tiny import tiny_random_model
from lookahead_core.capability import branching, run_probe
from tiny_families import PASSING, REFUSED, tiny_family_model

PROMPT = [5, 17, 3, 99, 42, 8, 61, 5, 17, 30, 3, 99]
LIMITS = DecodeLimits(max_new_tokens=16)


def generate(model, prompt, new):
    model.generation_config.eos_token_id = None
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", PASSING)
def test_listed_family_passes_the_probe_and_decodes_losslessly(family):
    model = tiny_family_model(family)
    result = probe(model)
    assert result.passed, result.reasons
    assert result.max_diff <= result.tolerance == 1e-3
    out = decode(model, PROMPT, LookaheadConfig(4, 3, 4, prompt_pool=True), LIMITS)
    assert out.tokens == decode(model, PROMPT, None, LIMITS).tokens


@pytest.mark.parametrize("family,reason", [
    ("mpt", "positions are not taken from position_ids"),
    ("bloom", "custom 4-D attention mask is not accepted"),
    ("falcon_alibi", "custom 4-D attention mask is not accepted"),
])
def test_alibi_families_are_refused_with_the_reason(family, reason):
    model = tiny_family_model(family)
    model_type = model.config.model_type
    with pytest.raises(UnsupportedModelError, match=f"this {model_type} model") as refused:
        decode(model, PROMPT, LookaheadConfig(5, 4, 5), LIMITS)
    message = str(refused.value)
    assert reason in message and "greedy" in message and "pool_only=True with a single draft per step" in message
    assert refused.value.model_type == model_type and isinstance(refused.value, ValueError)
    # MPT takes the mask but not the positions; the crashing ones fail on the mask.
    mask_reason = any("mask" in r for r in refused.value.reasons)
    assert mask_reason == (family != "mpt"), refused.value.reasons


@pytest.mark.parametrize("family", REFUSED)
def test_refused_families_still_run_greedy_and_causal_chain_configs(family):
    model = tiny_family_model(family)
    reference = generate(model, PROMPT, LIMITS.max_new_tokens)
    assert decode(model, PROMPT, None, LIMITS).tokens == reference
    for config in (LookaheadConfig(ngram=3, guess=1, pool_only=True), LookaheadConfig(window=1, ngram=4, guess=0),
                   LookaheadConfig(window=5, ngram=2, guess=0)):
        assert not branching(config)
        assert decode(model, PROMPT, config, LIMITS).tokens == reference, config


def test_which_configs_branch():
    assert not branching(None)
    assert branching(LookaheadConfig(5, 4, 5)) and branching(LookaheadConfig(ngram=3, guess=2, pool_only=True))
    assert branching(LookaheadConfig(window=2, ngram=2, guess=1))         # window row and a candidate
    assert not branching(LookaheadConfig(window=1, ngram=2, guess=1))     # N=2: the window has no rows
    # Draft sources of token trees: one draft per step is a chain, more may branch.
    assert not branching(LookaheadConfig(guess=0, sources={"suffix": 1}, pool_only=True, tree=True))
    assert not branching(LookaheadConfig(guess=0, sources={"recycle": 1}, pool_only=True, tree=True))
    assert branching(LookaheadConfig(guess=0, sources={"suffix": 2}, pool_only=True, tree=True))
    assert branching(LookaheadConfig(guess=0, sources={"recycle": 2}, pool_only=True, tree=True))
    assert branching(LookaheadConfig(guess=1, sources={"suffix": 1}, pool_only=True, tree=True))


def test_the_probe_runs_once_per_model(monkeypatch):
    model = tiny_random_model("llama", seed=5)
    calls = []
    real = probe_module.run_probe
    monkeypatch.setattr(probe_module, "run_probe", lambda lm: calls.append(1) or real(lm))
    for _ in range(3):
        decode(model, PROMPT, LookaheadConfig(3, 3, 3), DecodeLimits(max_new_tokens=4))
    decode(CausalLM(model), PROMPT, LookaheadConfig(3, 3, 3), DecodeLimits(max_new_tokens=4))
    assert calls == [1]
    decode(tiny_random_model("llama", seed=5), PROMPT, None, DecodeLimits(max_new_tokens=4))   # greedy: no probe
    assert calls == [1]


def test_a_mask_that_is_not_honoured_is_named():
    model = tiny_random_model("llama", seed=6)
    # The model drops the attention mask it is given (branches see each other); every other keyword,
    # the cache under whichever name this transformers reads, reaches it as passed.
    model.register_forward_pre_hook(lambda _, args, kwargs: (args, {**kwargs, "attention_mask": None}),
                                    with_kwargs=True)
    result = run_probe(CausalLM(model))
    assert not result.passed and result.max_diff > 1e-2
    assert any("hiding a key from the rows after it changes nothing" in r for r in result.reasons), result.reasons
    assert not any("position" in r for r in result.reasons), result.reasons
