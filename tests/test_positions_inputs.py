"""Position limits (never a row past the model's last position, output equal to ``generate``) and
input validation (bad ``input_ids`` fail with a named ValueError before any forward)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from transformers import GPT2Config, LlamaConfig, MptConfig, PretrainedConfig

from lookahead_core import DecodeLimits, LookaheadConfig, decode
from experiments.models.tiny import tiny_random_model
from lookahead_core.layout import Draft, build_tree, cut_tree
from lookahead_core.positions import StepFit, fit_step, position_limit
from tiny_families import tiny_family_model

LIMIT = 32


def test_position_limit_is_read_from_any_config():
    assert position_limit(GPT2Config(n_positions=77)) == 77
    assert position_limit(LlamaConfig(max_position_embeddings=99)) == 99
    assert position_limit(MptConfig(max_seq_len=55)) == 55
    assert position_limit(PretrainedConfig()) is None


def test_fit_step_keeps_rows_below_the_limit():
    # W=3 with 2 levels: rows up to p + 1 + 2; a tree node of depth d sits at p + d.
    assert fit_step(None, 10**6, 3, 2) == StepFit(True, None)
    assert fit_step(20, 16, 3, 2) == StepFit(True, 3)            # last window row 19
    assert fit_step(20, 17, 3, 2) == StepFit(False, 2)           # window would reach 20
    assert fit_step(20, 19, 3, 2) == StepFit(False, 0)           # only the input token fits
    assert fit_step(20, 5, 0, 0) == StepFit(False, 14)           # pool-only: no window to fit


def test_cut_tree_drops_the_nodes_past_a_depth():
    tree = build_tree([Draft((1, 2, 3), ("a",) * 3), Draft((1, 4), ("b",) * 2), Draft((5,), ("c",))])
    assert cut_tree(tree, None) is tree and cut_tree(tree, 3) is tree
    one = cut_tree(tree, 1)
    assert one.tokens == (1, 5) and one.parents == (-1, -1)
    two = cut_tree(tree, 2)
    assert two.tokens == (1, 2, 4, 5) and two.parents == (-1, 0, 0, -1)
    assert len(cut_tree(tree, 0)) == 0


@pytest.fixture(scope="module")
def gpt2():
    return tiny_family_model("gpt2", n_positions=LIMIT, seed=1)


@pytest.mark.parametrize("config", [
    LookaheadConfig(5, 4, 5, prompt_pool=True), LookaheadConfig(3, 5, 3), LookaheadConfig(ngram=4, guess=4, pool_only=True),
    LookaheadConfig(4, 4, 4, prompt_pool=True, tree=True, sources={"suffix": 2, "recycle": 2}, depth=6),
    LookaheadConfig(ngram=4, guess=2, pool_only=True, tree=True, sources={"suffix": 3, "recycle": 3}, depth=8,
                    budget=12),
])
def test_gpt2_at_its_position_limit_equals_generate(gpt2, config):
    prompt = [5, 17, 3, 99, 42, 8, 61, 5, 17, 3]
    new = LIMIT - len(prompt)                      # the last token sits at position LIMIT - 1
    gpt2.generation_config.eos_token_id = None
    expected = gpt2.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, pad_token_id=0)
    fed = []
    hook = gpt2.register_forward_pre_hook(lambda _, args, kwargs: fed.append(int(kwargs["position_ids"].max())),
                                          with_kwargs=True)
    try:
        out = decode(gpt2, prompt, config, DecodeLimits(max_new_tokens=new))
    finally:
        hook.remove()
    assert out.tokens == expected[0, len(prompt):].tolist()
    assert max(fed) <= LIMIT - 1                   # GPT-2 raises IndexError past its last position


def probe_free_model():
    model = tiny_random_model("llama", vocab_size=64)

    @functools.wraps(model.forward)         # the model's signature kept: CausalLM reads its keywords
    def refuse(*args, **kwargs):
        raise AssertionError("a forward ran before the input was checked")

    model.forward = refuse
    return model


@pytest.mark.parametrize("ids,message", [
    (torch.tensor([1.0, 2.0]), "integer token ids, got dtype torch.float32"),
    (torch.tensor([True, False]), "integer token ids, got dtype torch.bool"),
    (np.array([1.5, 2.0]), "integer token ids, got dtype float64"),
    ([1, 2.0, 3], "flat sequence of int token ids; found 2.0"),
    ([1, True], "found True"),
    ([[1, 2, 3]], "found a nested sequence"),
    (torch.zeros(1, 1, 3, dtype=torch.long), r"shape \(L,\) or \(1, L\), got \(1, 1, 3\)"),
    (torch.zeros(2, 3, dtype=torch.long), "batch size 2"),
    ([1, 64], r"token id 64 at index 1, outside the model's vocabulary \[0, 64\)"),
    (torch.tensor([-1, 3]), r"token id -1 at index 0"),
    ([], "input_ids is empty"),
    (torch.zeros(0, dtype=torch.long), "input_ids is empty"),
    ("hello", "not text"),
    (7, "sequence of token ids, got int"),
])
def test_bad_input_ids_are_refused_before_any_forward(ids, message):
    model = probe_free_model()
    for config in (None, LookaheadConfig(3, 3, 3)):
        with pytest.raises(ValueError, match=message):
            decode(model, ids, config)


def test_good_input_forms_agree():
    model = tiny_random_model("llama", vocab_size=64)
    limits = DecodeLimits(max_new_tokens=4)
    ids = [1, 5, 9, 63]
    expected = decode(model, ids, None, limits).tokens
    for form in (torch.tensor(ids), torch.tensor([ids], dtype=torch.int32), np.array(ids), tuple(np.int64(t) for t in ids)):
        assert decode(model, form, None, limits).tokens == expected
