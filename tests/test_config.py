"""Every impossible setting fails with a ValueError naming the field, before any model work."""

import pytest

from lookahead_core import DecodeLimits, LookaheadConfig, SamplingConfig, decode


@pytest.mark.parametrize("kwargs,field", [
    ({"window": 0}, "window"), ({"window": -3}, "window"), ({"window": 2.5}, "window"),
    ({"ngram": 1}, "ngram"), ({"ngram": "5"}, "ngram"), ({"guess": -1}, "guess"),
    ({"pool_only": True, "guess": 0}, "guess"), ({"seed": None}, "seed"), ({"window": True}, "window"),
    ({"tree": 1}, "tree"), ({"sources": {"suffix": -1}}, "suffix"), ({"sources": {"recycle": 1.5}}, "recycle"),
    ({"depth": -2}, "depth"),
    ({"budget": -1}, "budget"), ({"window": 3, "ngram": 3, "budget": 6}, "budget"),   # 6 < 1 + 2 + 3 + 1
    ({"pool_only": True, "guess": 2, "budget": 1}, "budget"),
    ({"recycle_window": True}, "recycle_window"), ({"sources": {"recycle": 2}, "recycle_window": 1}, "recycle_window"),
    ({"pool_only": True, "guess": 2, "sources": {"recycle": 2}, "recycle_window": True}, "recycle_window"),
    ({"step_costs": (1.0,)}, "step_costs"),                                       # no tree, no budget
    ({"pool_only": True, "guess": 2, "tree": True, "budget": 3, "step_costs": (1.0, 2.0)}, "step_costs"),
    ({"pool_only": True, "guess": 2, "tree": True, "budget": 2, "step_costs": (1.0, -2.0)}, "step_costs"),
    ({"pool_only": True, "guess": 2, "tree": True, "budget": 2, "step_costs": "12"}, "step_costs"),
])
def test_lookahead_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LookaheadConfig(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    ({"temperature": -0.1}, "temperature"), ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"seed": 1.5}, "seed"),
])
def test_sampling_config_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("kwargs,field", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"eos_token_ids": (-1,)}, "eos_token_ids"),
    ({"stop_strings": ("",)}, "stop_strings"),
])
def test_limits_reject(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DecodeLimits(**kwargs)


def test_valid_configs_and_derived_values():
    assert LookaheadConfig(window=4, ngram=3, guess=2).max_tokens_per_step == 1 + 3 + 4 + 2 * 2
    assert LookaheadConfig(pool_only=True, guess=3).prompt_pool
    assert DecodeLimits(eos_token_ids=7).eos_token_ids == (7,)
    assert DecodeLimits(stop_strings="\n\n").stop_strings == ("\n\n",)


def test_bad_inputs_fail_before_the_model_is_touched():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"model.{name} was touched")

    with pytest.raises(ValueError, match="empty"):
        decode(Untouchable(), [], None)
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        decode(Untouchable(), [1, 2], None, DecodeLimits(stop_strings=("x",)))


def test_tree_config_bounds():
    config = LookaheadConfig(window=3, ngram=3, guess=2, budget=7)
    assert config.window_rows == 6 and config.max_tokens_per_step == 7
    pool = LookaheadConfig(ngram=4, guess=2, pool_only=True, sources={"suffix": 2, "recycle": 4}, depth=3)
    # 1 + G*(N-1) + suffix*depth + recycle template 4 + 4*2 + 8*1
    assert pool.draft_depth == 3 and pool.max_tokens_per_step == 1 + 6 + 6 + 4 + 8 + 8
    assert LookaheadConfig(ngram=4, guess=0, pool_only=True, sources={"suffix": 1}).draft_depth == 3
