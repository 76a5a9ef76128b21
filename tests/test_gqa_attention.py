"""Grouped-query models under SDPA: a branching step attends to the cached K/V heads as they are.

transformers' SDPA attention copies K and V once per query head (``repeat_kv``) whenever a mask is
given, since SDPA's masked kernels take no ``enable_gqa``: on a branching step of Llama-3-8B or
Mistral-7B that is 4x the KV cache copied in every layer. ``lookahead_core.model_io`` folds the query
heads that share a K/V head into the query rows instead (``gqa_sdpa_attention``).
"""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as transformers_sdpa

from experiments.models.tiny import tiny_random_model
from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, decode, decode_batch
from lookahead_core.model_io import GQA_SDPA, gqa_sdpa_attention

PROMPT = [5, 17, 3, 99, 42, 7, 5, 17, 3, 99, 8, 61, 23, 5, 17]
CONFIGS = [LookaheadConfig(window=4, ngram=3, guess=4, prompt_pool=True),
           LookaheadConfig(window=3, ngram=3, guess=3, tree=True, sources={"suffix": 2}, budget=20)]


@pytest.fixture
def repeat_kv_calls(monkeypatch):
    calls = []
    stock = transformers_sdpa.repeat_kv

    def counting(hidden_states, n_rep):
        if n_rep > 1:
            calls.append(tuple(hidden_states.shape))
        return stock(hidden_states, n_rep)

    monkeypatch.setattr(transformers_sdpa, "repeat_kv", counting)
    return calls


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gemma3"])
def test_no_kv_repeat_on_branching_steps_and_tokens_equal_greedy(arch, repeat_kv_calls):
    model = tiny_random_model(arch)                     # 4 query heads, 2 K/V heads
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    limits = DecodeLimits(max_new_tokens=40)
    greedy = decode(model, PROMPT, None, limits).tokens
    for config in CONFIGS:
        out = decode(model, PROMPT, config, limits)
        assert out.tokens == greedy, config
        assert max(out.stats.step_tokens) > 1
    batch = decode_batch(model, [PROMPT, PROMPT[4:]], CONFIGS[0], limits)
    assert batch[0].tokens == greedy
    assert repeat_kv_calls == []
    assert model.config._attn_implementation == GQA_SDPA


def test_the_test_has_teeth_stock_sdpa_repeats_kv(repeat_kv_calls):
    """Without the folded attention (the model forced back to stock ``sdpa`` after ``CausalLM`` chose
    the folded one) the same decode calls ``repeat_kv``: the counter sees it."""
    model = tiny_random_model("llama")
    lm = CausalLM(model)
    model.set_attn_implementation("sdpa")
    decode(lm, PROMPT, CONFIGS[0], DecodeLimits(max_new_tokens=12))
    assert repeat_kv_calls


class _Attention(torch.nn.Module):
    num_key_value_groups = 4
    is_causal = True
    training = False


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_folded_heads_give_transformers_sdpa_output(dtype, tolerance):
    gen = torch.Generator().manual_seed(0)
    batch, kv_heads, groups, rows, past, dim = 2, 2, 4, 7, 13, 16
    query = torch.randn(batch, kv_heads * groups, rows, dim, generator=gen).to(dtype)
    key = torch.randn(batch, kv_heads, past + rows, dim, generator=gen).to(dtype)
    value = torch.randn(batch, kv_heads, past + rows, dim, generator=gen).to(dtype)
    allowed = torch.rand(batch, 1, rows, past + rows, generator=gen) < 0.6
    allowed[..., 0] = True                                   # every row sees something
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    module = _Attention()
    ours, _ = gqa_sdpa_attention(module, query, key, value, mask, scaling=dim ** -0.5)
    stock, _ = transformers_sdpa.sdpa_attention_forward(module, query, key, value, mask, scaling=dim ** -0.5)
    assert ours.shape == stock.shape == (batch, rows, kv_heads * groups, dim)
    assert (ours.float() - stock.float()).abs().max() <= tolerance
