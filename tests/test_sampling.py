"""Lookahead sampling keeps the model's distribution; the test is shown to catch a biased verifier."""

import itertools

import pytest
import torch
from scipy.stats import chi2

import lookahead_core.decoder as decoder_module
from lookahead_core import DecodeLimits, LookaheadConfig, SamplingConfig, decode
from experiments.models.tiny import tiny_random_model
from lookahead_core.verify import make_verifier, make_warper, sampling_probs, walk_tree

VOCAB, DEPTH, DRAWS = 5, 3, 2000
PROMPT = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 2, 3]          # every token, repeated: the prompt pool has candidates
LOOKAHEAD = LookaheadConfig(window=3, ngram=3, guess=8, prompt_pool=True)
# Token trees from every source: merged prefixes, suffix matches, recycled successors, a budget.
TREE = LookaheadConfig(window=3, ngram=3, guess=8, prompt_pool=True, tree=True, sources={"suffix": 3, "recycle": 3},
                       depth=3)
TREE_BUDGET = LookaheadConfig(window=1, ngram=3, guess=4, pool_only=True, tree=True,
                              sources={"suffix": 2, "recycle": 3}, budget=6)


@pytest.fixture(scope="module")
def model():
    # A gentle init keeps the next-token distributions spread out, so every branch gets exercised.
    return tiny_random_model("llama", seed=0, vocab_size=VOCAB, initializer_range=0.05)


def exact_distribution(model, sampling, prompt=PROMPT):
    """P(first DEPTH tokens) after ``prompt`` by enumeration: the product of the warped next-token
    distributions."""
    warper = make_warper(sampling)
    probs = {}
    with torch.inference_mode():
        for seq in itertools.product(range(VOCAB), repeat=DEPTH - 1):
            logits = model(torch.tensor([prompt + list(seq)])).logits[0, len(prompt) - 1:]     # (DEPTH, V)
            steps = sampling_probs(logits, warper)
            prefix = steps[0, seq[0]] * (steps[1, seq[1]] if DEPTH > 2 else 1)
            for last in range(VOCAB):
                probs[(*seq, last)] = float(prefix * steps[DEPTH - 1, last])
    return probs


def draw(model, lookahead, sampling, n=DRAWS):
    """Counts of the first DEPTH tokens over n seeds, and how many draws took a multi-token step."""
    counts, multi = {}, 0
    for seed in range(n):
        cfg = SamplingConfig(sampling.temperature, sampling.top_k, sampling.top_p, seed=seed)
        out = decode(model, PROMPT, lookahead, DecodeLimits(max_new_tokens=DEPTH), cfg)
        key = tuple(out.tokens)
        counts[key] = counts.get(key, 0) + 1
        multi += any(a > 1 for a in out.stats.accepted)
    return counts, multi


def chi_square_pvalue(counts, probs, n):
    """Goodness of fit of the counts to the exact probabilities; bins with E < 5 pooled together."""
    stat, bins, rest_o, rest_e = 0.0, 0, 0.0, 0.0
    for key, p in probs.items():
        expected, observed = n * p, counts.get(key, 0)
        if expected >= 5:
            stat += (observed - expected) ** 2 / expected
            bins += 1
        else:
            rest_o, rest_e = rest_o + observed, rest_e + expected
    if rest_e > 0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        bins += 1
    return float(chi2.sf(stat, bins - 1))


SETTINGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=4, top_p=0.9)]


@pytest.mark.parametrize("sampling", SETTINGS, ids=["t1", "t0.7-k4-p0.9"])
def test_lookahead_sampling_matches_the_model_distribution(model, sampling):
    probs = exact_distribution(model, sampling)
    assert abs(sum(probs.values()) - 1) < 1e-6
    counts, multi = draw(model, LOOKAHEAD, sampling)
    assert multi > DRAWS // 10, "drafts were rarely accepted: the verifier was hardly exercised"
    assert chi_square_pvalue(counts, probs, DRAWS) > 1e-3
    # The baseline through the same loop passes the same test.
    assert chi_square_pvalue(draw(model, None, sampling, n=600)[0], probs, 600) > 1e-3


@pytest.mark.parametrize("lookahead", [TREE, TREE_BUDGET], ids=["tree", "tree-budget"])
@pytest.mark.parametrize("sampling", SETTINGS, ids=["t1", "t0.7-k4-p0.9"])
def test_tree_sampling_matches_the_model_distribution(model, sampling, lookahead):
    """Recursive rejection over each node's children keeps the distribution, on merged trees."""
    probs = exact_distribution(model, sampling)
    counts, multi = draw(model, lookahead, sampling)
    assert multi > DRAWS // 10, "drafts were rarely accepted: the verifier was hardly exercised"
    assert chi_square_pvalue(counts, probs, DRAWS) > 1e-3


def always_accept_verifier(sampling_cfg, generator=None):
    """Accepts the first child at every node, whatever p says; samples only the bonus token."""
    honest = make_verifier(sampling_cfg, generator)

    class AlwaysAccept:
        choose = staticmethod(honest.choose)

        def __call__(self, tree, logits, rows=None, chosen=None):
            chosen = chosen if chosen is not None else honest.choose(logits).tolist()
            drawn = chosen if rows is None else [chosen[r] for r in rows]
            return walk_tree(tree, lambda row, options: (options[0], True) if options else (drawn[row], False))

    return AlwaysAccept()


@pytest.mark.parametrize("lookahead", [LOOKAHEAD, TREE], ids=["linear", "tree"])
def test_the_test_has_teeth_a_verifier_that_always_accepts_fails(model, monkeypatch, lookahead):
    """Accepting the first draft whole, whatever p says, biases the output; the test must see it."""
    sampling = SETTINGS[0]
    monkeypatch.setattr(decoder_module, "make_verifier", always_accept_verifier)
    probs = exact_distribution(model, sampling)
    counts, _ = draw(model, lookahead, sampling)
    assert chi_square_pvalue(counts, probs, DRAWS) < 1e-6


def test_verifier_distribution_equals_generate_warpers(model):
    """The per-position distribution equals softmax of the scores ``generate`` samples from."""
    prompt = torch.tensor([PROMPT])
    for sampling in [SamplingConfig(1.0), SamplingConfig(0.5, top_k=3), SamplingConfig(1.3, top_p=0.6),
                     SamplingConfig(0.8, top_k=2, top_p=0.95)]:
        out = model.generate(prompt, do_sample=True, max_new_tokens=1, temperature=sampling.temperature,
                             top_k=sampling.top_k or None, top_p=sampling.top_p, output_scores=True,
                             return_dict_in_generate=True, attention_mask=torch.ones_like(prompt))
        expected = torch.softmax(out.scores[0][0].double(), -1)
        with torch.inference_mode():
            raw = model(prompt).logits[0, -1]
        assert torch.allclose(sampling_probs(raw, make_warper(sampling)), expected, atol=1e-6)


def test_warpers_on_fixed_logits_by_hand():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    p = sampling_probs(logits, make_warper(SamplingConfig(temperature=2.0)))
    assert torch.allclose(p, torch.softmax(logits.double() / 2, -1))
    p = sampling_probs(logits, make_warper(SamplingConfig(temperature=1.0, top_k=2)))
    assert torch.allclose(p, torch.tensor([1 / (1 + torch.e ** -1), 1 - 1 / (1 + torch.e ** -1), 0, 0]).double())
    # top-p 0.7: the smallest set whose mass reaches 0.7 is {0, 1} (0.644 < 0.7 < 0.881).
    p = sampling_probs(logits, make_warper(SamplingConfig(temperature=1.0, top_p=0.7)))
    assert (p[2:] == 0).all() and torch.isclose(p[:2].sum(), torch.tensor(1.0).double())


def test_same_seed_same_sample_and_temperature_zero_is_greedy(model):
    sampling = SamplingConfig(temperature=1.0, seed=11)
    limits = DecodeLimits(max_new_tokens=32)
    a = decode(model, PROMPT, LOOKAHEAD, limits, sampling).tokens
    assert a == decode(model, PROMPT, LOOKAHEAD, limits, sampling).tokens
    others = {tuple(decode(model, PROMPT, LOOKAHEAD, limits, SamplingConfig(1.0, seed=s)).tokens) for s in range(5)}
    assert len(others) > 1
    assert decode(model, PROMPT, LOOKAHEAD, limits, SamplingConfig(0.0)).tokens == decode(model, PROMPT, None, limits).tokens
