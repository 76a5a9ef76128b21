"""Lookahead output is token-identical to greedy, in fp32, on tiny random models of each family."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from lookahead_core import DecodeLimits, DecodeState, LookaheadConfig, NGramPool, decode
from experiments.models.tiny import tiny_random_model

ARCHS = ("llama", "mistral", "qwen2", "gemma3")
NEW = 48
# N = 2, W = 1, G = 0 and a large G are all in the grid.
GRID = [(w, n, g) for w, n, g in itertools.product([1, 3, 6], [2, 3, 5], [0, 2, 12])]


def repetitive_prompt(vocab: int, length: int = 24, seed: int = 0) -> list[int]:
    """A prompt with repeats, so that the pool has something to find."""
    gen = torch.Generator().manual_seed(seed)
    motif = torch.randint(0, vocab, (6,), generator=gen).tolist()
    noise = torch.randint(0, vocab, (length,), generator=gen).tolist()
    return (motif + noise[: length // 2] + motif + noise[length // 2:])[:length]


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    return request.param, tiny_random_model(request.param, seed=1)


def greedy(model, prompt, limits=DecodeLimits(max_new_tokens=NEW)):
    return decode(model, prompt, None, limits).tokens


def test_grid_equals_greedy(arch_model):
    arch, model = arch_model
    prompt = repetitive_prompt(model.config.vocab_size)
    reference = greedy(model, prompt)
    assert len(reference) == NEW
    compressions = []
    for w, n, g in GRID:
        for pool in (False, True):
            out = decode(model, prompt, LookaheadConfig(w, n, g, prompt_pool=pool), DecodeLimits(max_new_tokens=NEW))
            assert out.tokens == reference, f"{arch} W={w} N={n} G={g} pool={pool}"
            assert out.stats.steps == len(out.stats.accepted) and sum(out.stats.accepted) == NEW - 1
            compressions.append(out.stats.compression)
    assert max(compressions) > 1.0, "no configuration ever accepted a candidate: the test is too weak"


# Token trees: merged prefixes, every draft source, budgets from tiny to none, deep drafts.
TREE_GRID = [
    LookaheadConfig(3, 3, 4, prompt_pool=True, tree=True),
    LookaheadConfig(6, 5, 12, prompt_pool=True, tree=True, sources={"suffix": 3, "recycle": 3}),
    LookaheadConfig(4, 4, 6, tree=True, sources={"recycle": 4}, budget=20),
    LookaheadConfig(5, 5, 5, prompt_pool=True, tree=True, sources={"suffix": 4, "recycle": 4}, recycle_window=True,
                    depth=6, budget=30),
    LookaheadConfig(3, 3, 4, prompt_pool=True, sources={"suffix": 2, "recycle": 2}),   # sources, linear branches
    LookaheadConfig(ngram=3, guess=4, pool_only=True, tree=True, sources={"suffix": 4}),
    LookaheadConfig(ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 3}, depth=7),
    LookaheadConfig(ngram=4, guess=0, pool_only=True, tree=True, sources={"recycle": 4}, depth=5),
    LookaheadConfig(ngram=5, guess=8, pool_only=True, tree=True, sources={"suffix": 4, "recycle": 4}, budget=2),
    LookaheadConfig(ngram=5, guess=8, pool_only=True, tree=True, sources={"suffix": 4, "recycle": 4}, budget=9),
    LookaheadConfig(ngram=2, guess=3, pool_only=True, tree=True, sources={"suffix": 1, "recycle": 1}, depth=1),
    LookaheadConfig(ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 1}, depth=10),   # auto's deep ones
    LookaheadConfig(ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 4}, depth=10, budget=12),
    # Cost-aware trees: a CPU-like curve (2-3 token steps dear, 4 cheap) and a GPU-like flat one.
    LookaheadConfig(ngram=4, guess=4, pool_only=True, tree=True, sources={"suffix": 4, "recycle": 4}, depth=6,
                    budget=8, step_costs=(1.0, 2.0, 2.6, 1.7, 1.9, 1.9, 2.0, 2.1)),
    LookaheadConfig(5, 4, 4, prompt_pool=True, tree=True, sources={"suffix": 2, "recycle": 2}, budget=24,
                    step_costs=tuple(1.0 + 0.01 * k for k in range(24))),
]


def test_tree_grid_equals_greedy(arch_model):
    arch, model = arch_model
    prompt = repetitive_prompt(model.config.vocab_size)
    reference = greedy(model, prompt)
    accepted_deep = False
    for config in TREE_GRID:
        out = decode(model, prompt, config, DecodeLimits(max_new_tokens=NEW))
        assert out.tokens == reference, f"{arch} {config}"
        assert sum(out.stats.accepted) == NEW - 1
        if config.budget:
            assert max(out.stats.step_tokens) <= config.budget
        accepted_deep |= max(out.stats.accepted) > 2
    assert accepted_deep, "no tree ever accepted two draft tokens in a step: the test is too weak"


def test_trees_cut_by_a_learnt_prior_equal_greedy_and_hand_it_on(arch_model):
    """``DecodeState.drafts`` (what auto's calibration survey measured) only changes which nodes a
    step feeds: measured, misleadingly optimistic (every node accepted) or pessimistic (none), the
    tokens equal greedy, and the returned state's acceptance is the prior's counts plus the decode's."""
    from lookahead_core import DraftStats

    arch, model = arch_model
    prompt = repetitive_prompt(model.config.vocab_size)
    reference = greedy(model, prompt)
    limits = DecodeLimits(max_new_tokens=NEW)
    survey = decode(model, prompt[:12], TREE_GRID[1], limits)            # any decode's measured acceptance
    measured = survey.state.drafts
    assert measured == survey.stats.drafts and sum(measured.counts.tried.values()) > 0
    tags = ([f"suffix:{b}:c{c}" for b in (1, 2, 3, 4, 8, 16, 32) for c in (1, 2, 3)]
            + [f"{origin}:h{h}" for origin in ("pool", "jacobi") for h in (1, 2, 3)]
            + [f"recycle:p{decile}" for decile in range(10)])
    keys = {(tag, d) for tag in tags for d in range(1, 11)}
    optimist, pessimist = DraftStats(), DraftStats()
    for key in keys:
        optimist.counts.tried[key] = optimist.counts.accepted[key] = pessimist.counts.tried[key] = 50
        pessimist.counts.accepted[key] = 0
    fed = {}
    for name, prior in (("measured", measured), ("optimist", optimist), ("pessimist", pessimist)):
        for config in TREE_GRID[-2:] + TREE_GRID[8:10]:                   # cost-aware and budget-cut trees
            out = decode(model, prompt, config, limits, state=DecodeState(None, [], drafts=prior))
            assert out.tokens == reference, f"{arch} {name} {config}"
            assert out.state.drafts.counts.tried == prior.counts.tried + out.stats.drafts.counts.tried
            fed[name, config] = sum(out.stats.step_tokens)
    aware = TREE_GRID[-2]
    assert fed["optimist", aware] > fed["pessimist", aware], "the prior never changed what a step fed"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_eager_attention_equals_greedy(arch):
    model = tiny_random_model(arch, seed=2, attn_implementation="eager")
    prompt = repetitive_prompt(model.config.vocab_size, seed=2)
    reference = greedy(model, prompt)
    for w, n, g in [(4, 3, 4), (2, 5, 8), (1, 2, 1)]:
        assert decode(model, prompt, LookaheadConfig(w, n, g, prompt_pool=True),
                      DecodeLimits(max_new_tokens=NEW)).tokens == reference
    for config in TREE_GRID[1:3]:
        assert decode(model, prompt, config, DecodeLimits(max_new_tokens=NEW)).tokens == reference, config


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "qwen2"])
def test_contexts_longer_than_the_sliding_window(arch):
    model = tiny_random_model(arch, seed=3, sliding_window=8)
    windows = set(getattr(model.config, "layer_types", None) or ["sliding_attention"])
    assert "sliding_attention" in windows or model.config.sliding_window == 8
    prompt = repetitive_prompt(model.config.vocab_size, length=20, seed=3)   # prompt alone > window
    reference = greedy(model, prompt)
    for w, n, g in [(5, 4, 5), (3, 2, 3), (7, 5, 2)]:
        assert decode(model, prompt, LookaheadConfig(w, n, g, prompt_pool=True),
                      DecodeLimits(max_new_tokens=NEW)).tokens == reference
    for config in TREE_GRID[1:3] + TREE_GRID[5:7]:
        assert decode(model, prompt, config, DecodeLimits(max_new_tokens=NEW)).tokens == reference, config


def test_greedy_baseline_equals_transformers_generate(arch_model):
    arch, model = arch_model
    prompt = repetitive_prompt(model.config.vocab_size, seed=4)
    model.generation_config.eos_token_id = None
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False)[0, len(prompt):]
    assert greedy(model, prompt) == expected.tolist()


def test_pool_only_prompt_lookup_equals_greedy(arch_model):
    _, model = arch_model
    prompt = repetitive_prompt(model.config.vocab_size, seed=5)
    out = decode(model, prompt, LookaheadConfig(ngram=3, guess=4, pool_only=True), DecodeLimits(max_new_tokens=NEW))
    assert out.tokens == greedy(model, prompt)
    assert set(out.stats.step_tokens) <= {1 + c * 2 for c in range(5)}        # no window rows


# --- forced acceptance -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama():
    return tiny_random_model("llama", seed=7)


def true_pool(prompt, continuation, ngram):
    """A pool holding every n-gram of the greedy text: every step can accept N tokens."""
    pool = NGramPool(ngram, capacity=64)
    pool.add_from_sequence(prompt[-1:] + continuation)
    return pool


def test_all_accept_reaches_n_tokens_per_step(llama):
    prompt = repetitive_prompt(llama.config.vocab_size, seed=8)
    reference = greedy(llama, prompt)
    for n in (2, 3, 5):
        config = LookaheadConfig(ngram=n, guess=64, pool_only=True)
        out = decode(llama, prompt, config, DecodeLimits(max_new_tokens=NEW),
                     state=DecodeState.with_pool(true_pool(prompt, reference, n)))
        assert out.tokens == reference
        full_steps = (NEW - 1) // n
        assert out.stats.accepted[:full_steps] == [n] * full_steps        # N per step, bonus included
        assert out.stats.compression > n - 1


@pytest.mark.parametrize("budget", [0, 12])
def test_all_accept_tree_reaches_n_tokens_per_step(llama, budget):
    """A pool with every n-gram of the greedy text, plus wrong recycled siblings, merged in one tree."""
    prompt = repetitive_prompt(llama.config.vocab_size, seed=8)
    reference = greedy(llama, prompt)
    n = 5
    config = LookaheadConfig(ngram=n, guess=64, pool_only=True, tree=True, sources={"recycle": 3}, budget=budget)
    out = decode(llama, prompt, config, DecodeLimits(max_new_tokens=NEW),
                 state=DecodeState.with_pool(true_pool(prompt, reference, n)))
    assert out.tokens == reference
    if budget:          # the budget may cut the true path: only the cap and some acceptance are certain
        assert max(out.stats.step_tokens) <= budget and out.stats.compression > 1.5
    else:
        full_steps = (NEW - 1) // n
        assert out.stats.accepted[:full_steps] == [n] * full_steps


def test_suffix_source_accepts_whole_drafts_on_a_loop(llama):
    """This prompt's greedy text falls into a 2-token loop; suffix drafts copy it depth + 1 per step."""
    prompt = repetitive_prompt(llama.config.vocab_size, seed=2)
    reference = greedy(llama, prompt, DecodeLimits(max_new_tokens=64))
    for tree in (True, False):
        config = LookaheadConfig(ngram=2, guess=0, pool_only=True, tree=tree, sources={"suffix": 2}, depth=7)
        out = decode(llama, prompt, config, DecodeLimits(max_new_tokens=64))
        assert out.tokens == reference and out.stats.accepted[-3:-1] == [8, 8]
        assert out.stats.drafts.counts.table()[0]["source"] == "suffix"


def test_none_accept_has_compression_one(llama):
    prompt = repetitive_prompt(llama.config.vocab_size, seed=9)
    reference = greedy(llama, prompt)
    vocab = llama.config.vocab_size
    text = prompt + reference
    followers = {k: {text[i + 1] for i in range(len(text) - 1) if text[i] == k} for k in range(vocab)}

    class PinnedPool(NGramPool):
        """Holds only the n-grams given up front: nothing the decoder harvests gets in."""

        def add(self, gram, origin="pool"):
            pass

    gen = torch.Generator().manual_seed(0)
    pool = PinnedPool(ngram=4, capacity=5)
    for key in range(vocab):
        wrong = [t for t in range(vocab) if t not in followers[key]]
        for _ in range(5):
            first = wrong[int(torch.randint(len(wrong), (1,), generator=gen))]
            NGramPool.add(pool, [key, first, *torch.randint(vocab, (2,), generator=gen).tolist()])
    for tree in (False, True):
        out = decode(llama, prompt, LookaheadConfig(ngram=4, guess=5, pool_only=True, tree=tree),
                     DecodeLimits(max_new_tokens=NEW), state=DecodeState.with_pool(pool))
        assert out.tokens == reference
        assert out.stats.compression == 1.0 and max(out.stats.step_tokens) > 1   # candidates were fed, none taken
        assert sum(out.stats.drafts.counts.accepted.values()) == 0 and sum(out.stats.drafts.counts.tried.values()) > 0


def test_eos_and_max_tokens_inside_an_accepted_run(llama):
    prompt = repetitive_prompt(llama.config.vocab_size, seed=10)
    reference = greedy(llama, prompt)
    eos_at = next(i for i in range(10, NEW) if reference[i] not in reference[:i])
    eos = reference[eos_at]
    config = LookaheadConfig(ngram=5, guess=64, pool_only=True)
    stop = decode(llama, prompt, config, DecodeLimits(max_new_tokens=NEW, eos_token_ids=(eos,)),
                  state=DecodeState.with_pool(true_pool(prompt, reference, 5)))
    assert stop.tokens == reference[: eos_at + 1]
    assert stop.tokens == greedy(llama, prompt, DecodeLimits(max_new_tokens=NEW, eos_token_ids=(eos,)))
    for limit in (1, 2, 7, 23):
        cut = decode(llama, prompt, config, DecodeLimits(max_new_tokens=limit),
                     state=DecodeState.with_pool(true_pool(prompt, reference, 5)))
        assert cut.tokens == reference[:limit]
    tree = LookaheadConfig(ngram=5, guess=64, pool_only=True, tree=True, sources={"recycle": 2}, budget=10)
    stop = decode(llama, prompt, tree, DecodeLimits(max_new_tokens=NEW, eos_token_ids=(eos,)),
                  state=DecodeState.with_pool(true_pool(prompt, reference, 5)))
    assert stop.tokens == reference[: eos_at + 1] and max(stop.stats.accepted) == 5
    for limit in (1, 2, 7, 23):
        cut = decode(llama, prompt, tree, DecodeLimits(max_new_tokens=limit),
                     state=DecodeState.with_pool(true_pool(prompt, reference, 5)))
        assert cut.tokens == reference[:limit]


def test_stop_strings_truncate_like_greedy(llama):
    class Spaced:
        """A stand-in tokenizer: token t decodes to 't '."""

        def decode(self, ids):
            return "".join(f"{t} " for t in ids)

    prompt = repetitive_prompt(llama.config.vocab_size, seed=11)
    reference = greedy(llama, prompt)
    stop = f" {reference[12]} {reference[13]} "
    limits = DecodeLimits(max_new_tokens=NEW, stop_strings=(stop,))
    base = decode(llama, prompt, None, limits, tokenizer=Spaced()).tokens
    out = decode(llama, prompt, LookaheadConfig(4, 3, 4, prompt_pool=True), limits, tokenizer=Spaced()).tokens
    assert out == base and stop in Spaced().decode(out) and len(out) <= 14


# --- shapes of input -------------------------------------------------------------------------

def test_prompt_shorter_than_the_window(llama):
    for prompt in ([5], [5, 9]):
        assert decode(llama, prompt, LookaheadConfig(7, 4, 7), DecodeLimits(max_new_tokens=NEW)).tokens == greedy(llama, prompt)


@pytest.mark.parametrize("config", [LookaheadConfig(4, 3, 4, prompt_pool=True),
                                    LookaheadConfig(4, 3, 4, prompt_pool=True, tree=True,
                                                    sources={"suffix": 2, "recycle": 2}, budget=24)],
                         ids=["linear", "tree"])
def test_second_turn_reuses_the_cache_and_equals_a_fresh_decode(llama, config):
    limits = DecodeLimits(max_new_tokens=24)
    turn1 = repetitive_prompt(llama.config.vocab_size, seed=12)
    first = decode(llama, turn1, config, limits)
    turn2 = turn1 + first.tokens + [3, 1, 4, 1, 5]
    replay = decode(llama, turn2, config, limits, state=first.state.copy())
    second = decode(llama, turn2, config, limits, state=first.state)
    assert replay.tokens == second.tokens and replay.stats.accepted == second.stats.accepted
    assert second.stats.prefill_tokens == 5 + 1      # the new user tokens plus the last answer token
    assert second.tokens == greedy(llama, turn2, limits)
    # A conversation edited in the middle only reuses the common prefix.
    edited = turn1[:5] + [(turn1[5] + 1) % llama.config.vocab_size] + turn2[6:]
    again = decode(llama, edited, config, limits, state=second.state)
    assert again.stats.prefill_tokens == len(edited) - 5
    assert again.tokens == greedy(llama, edited, limits)


def test_same_seed_same_steps(llama):
    prompt = repetitive_prompt(llama.config.vocab_size, seed=13)
    runs = [decode(llama, prompt, LookaheadConfig(5, 4, 5, seed=3), DecodeLimits(max_new_tokens=NEW)).stats.accepted
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_unsupported_inputs_are_refused(llama):
    with pytest.raises(ValueError, match="batch size 2"):
        decode(llama, torch.zeros(2, 4, dtype=torch.long), None)
    flash = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match="flash_attention_2"):
        decode(flash, [1, 2, 3], LookaheadConfig())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_model_built_causal_mask_equals_the_explicit_one(arch, attn):
    """Chains skip our mask (visible=None); the model's own mask must give the same logits,
    sliding windows included (cache of 20 > window 8)."""
    from lookahead_core.layout import causal_layout
    from lookahead_core.model_io import CausalLM

    lm = CausalLM(tiny_random_model(arch, seed=4, sliding_window=8, attn_implementation=attn))
    prompt = repetitive_prompt(lm.model.config.vocab_size, length=20)
    outs = []
    for explicit in (True, False):
        cache = lm.new_cache()
        offsets, visible = causal_layout(len(prompt))
        first = lm.forward(cache, prompt, offsets, visible if explicit else None, 0, torch.arange(len(prompt)))
        offsets, visible = causal_layout(3)
        step = lm.forward(cache, [5, 6, 7], offsets, visible if explicit else None, len(prompt), torch.arange(3))
        outs.append((first, step))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="right after the cache"):
        lm.forward(lm.new_cache(), [1, 2], torch.arange(2), None, 3, torch.arange(2))
