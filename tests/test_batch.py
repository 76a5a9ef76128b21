"""decode_batch: every sequence of a batch gets exactly what it gets alone.

Greedy rows are token-identical, in fp32, to single-sequence ``generate(do_sample=False)`` and to
transformers' own batched, left-padded ``generate``, on four architectures (sliding windows
included), for prompts of very different lengths and EOS at different steps; sampled rows keep the
model's distribution (tests/test_sampling.py's chi-square test, per row).
"""

import pytest
import torch
from test_sampling import DEPTH, VOCAB, always_accept_verifier, chi_square_pvalue, exact_distribution

import lookahead_core.decoder as decoder_module
from lookahead_core import DecodeLimits, LookaheadConfig, SamplingConfig, decode, decode_batch
from experiments.models.tiny import tiny_random_model

NEW = 40
LENGTHS = (1, 3, 14, 37)          # very different prompt lengths, longer than the window of 8 too
CONFIGS = {
    "greedy": None,
    "lookahead": LookaheadConfig(4, 3, 4, prompt_pool=True),
    "lookahead-wide": LookaheadConfig(6, 5, 8),
    "pool-only": LookaheadConfig(ngram=4, guess=3, pool_only=True),
    "tree": LookaheadConfig(4, 4, 6, prompt_pool=True, tree=True, sources={"suffix": 2, "recycle": 3}, budget=24),
    "pool-tree": LookaheadConfig(ngram=4, guess=4, pool_only=True, tree=True, sources={"suffix": 3, "recycle": 3},
                                 depth=5),
}


def prompts_for(vocab, lengths=LENGTHS, seed=0):
    """Prompts with repeats, so that pools and suffix drafts have something to find."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        motif = torch.randint(0, vocab, (5,), generator=gen).tolist()
        noise = torch.randint(0, vocab, (n,), generator=gen).tolist()
        out.append((motif + noise[: n // 2] + motif + noise[n // 2:])[:n])
    return out


def generate_alone(model, prompt, new=NEW, eos=None):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                         eos_token_id=eos, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2", "gemma3"])
def windowed(request):
    """Each architecture; all but llama with sliding-window layers of 8 (every layer for mistral,
    the upper half for qwen2, alternate layers for gemma3)."""
    arch = request.param
    return arch, tiny_random_model(arch, seed=5, **({} if arch == "llama" else {"sliding_window": 8}))


def test_every_row_equals_generate_alone(windowed):
    arch, model = windowed
    prompts = prompts_for(model.config.vocab_size)
    expected = [generate_alone(model, p) for p in prompts]
    accepted_more = False
    for name, config in CONFIGS.items():
        outs = decode_batch(model, prompts, config, DecodeLimits(max_new_tokens=NEW))
        for b, (out, want) in enumerate(zip(outs, expected)):
            assert out.tokens == want, f"{arch} {name} row {b} (prompt of {len(prompts[b])})"
            assert sum(out.stats.accepted) == NEW - 1 and out.stats.steps == len(out.stats.accepted)
        accepted_more |= any(o.stats.compression > 1.2 for o in outs)
    assert accepted_more, "no row ever accepted drafts: the test is too weak"


def test_rows_stop_at_eos_at_different_steps(windowed):
    arch, model = windowed
    prompts = prompts_for(model.config.vocab_size, seed=1)
    free = [generate_alone(model, p) for p in prompts]
    # The token that ends the rows earliest on average but not all at once.
    def stop_at(text, token):
        return text.index(token) + 1 if token in text else NEW
    eos = min(set().union(*free), key=lambda t: (len({stop_at(f, t) for f in free}) < 3, sum(stop_at(f, t) for f in free)))
    stops = [stop_at(f, eos) for f in free]
    assert len(set(stops)) >= 3, f"{arch}: no token ends the rows at three different steps ({stops})"
    limits = DecodeLimits(max_new_tokens=NEW, eos_token_ids=(eos,))
    for name in ("greedy", "lookahead", "tree"):
        outs = decode_batch(model, prompts, CONFIGS[name], limits)
        for b, out in enumerate(outs):
            assert out.tokens == generate_alone(model, prompts[b], eos=eos), f"{arch} {name} row {b}"
            assert len(out.tokens) == stops[b]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gemma3"])
def test_rows_equal_transformers_batched_left_padded_generate(arch):
    # transformers' sliding window counts cache slots, left padding included, so a padded row sees
    # fewer real tokens than it would alone; keep the windows wider than any context here.
    model = tiny_random_model(arch, seed=6, **({"sliding_window": 512} if arch != "llama" else {}))
    prompts = prompts_for(model.config.vocab_size, seed=2)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    for name in ("greedy", "lookahead", "pool-tree"):
        outs = decode_batch(model, prompts, CONFIGS[name], DecodeLimits(max_new_tokens=NEW))
        assert [o.tokens for o in outs] == batched[:, width:].tolist(), f"{arch} {name}"


@pytest.fixture(scope="module")
def llama():
    return tiny_random_model("llama", seed=7)


def test_a_row_ignores_its_companions(llama):
    """Same prompt, any companions (short, long, finished at once, identical): same tokens and steps."""
    prompts = prompts_for(llama.config.vocab_size, seed=3)
    config = CONFIGS["tree"]
    alone = decode(llama, prompts[1], config, DecodeLimits(max_new_tokens=NEW))
    for companions in ([prompts[0]], [prompts[3], prompts[2]], [prompts[1]] * 3, [[7]] * 5):
        outs = decode_batch(llama, [*companions, prompts[1]], config, DecodeLimits(max_new_tokens=NEW))
        assert outs[-1].tokens == alone.tokens and outs[-1].stats.accepted == alone.stats.accepted


def test_max_new_tokens_one_and_a_batch_of_one(llama):
    prompts = prompts_for(llama.config.vocab_size, seed=4)
    outs = decode_batch(llama, prompts, CONFIGS["lookahead"], DecodeLimits(max_new_tokens=1))
    assert [o.tokens for o in outs] == [generate_alone(llama, p, new=1) for p in prompts]
    assert all(o.stats.steps == 0 for o in outs)
    one = decode_batch(llama, prompts[2:3], CONFIGS["tree"], DecodeLimits(max_new_tokens=NEW))[0]
    alone = decode(llama, prompts[2], CONFIGS["tree"], DecodeLimits(max_new_tokens=NEW))
    assert one.tokens == alone.tokens and one.stats.step_tokens == alone.stats.step_tokens


def test_each_row_state_continues_the_conversation(llama):
    """Each finished row hands back its own KV and pool; a second turn from it equals a fresh decode."""
    prompts = prompts_for(llama.config.vocab_size, seed=5)
    config = CONFIGS["lookahead"]
    limits = DecodeLimits(max_new_tokens=16)
    outs = decode_batch(llama, prompts, config, limits)
    for prompt, out in zip(prompts, outs):
        assert out.state.cache.get_seq_length() == len(prompt) + len(out.tokens) - 1
        turn2 = prompt + out.tokens + [3, 1, 4]
        second = decode(llama, turn2, config, limits, state=out.state)
        assert second.stats.prefill_tokens == 4
        assert second.tokens == generate_alone(llama, turn2, new=16)


def test_bad_batches_are_refused(llama):
    with pytest.raises(ValueError, match="prompts is empty"):
        decode_batch(llama, [], None)
    with pytest.raises(ValueError, match="input_ids is empty"):
        decode_batch(llama, [[1, 2], []], None)
    with pytest.raises(ValueError, match="use decode_batch"):
        decode(llama, torch.zeros(2, 4, dtype=torch.long), None)


# --- sampling, per row -----------------------------------------------------------------------

SAMPLE_PROMPTS = [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 2, 3], [3, 1], [4, 4, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2]]
SAMPLE_TREE = LookaheadConfig(window=3, ngram=3, guess=8, prompt_pool=True, tree=True,
                              sources={"suffix": 3, "recycle": 3}, depth=3)
DRAWS = 1500


@pytest.fixture(scope="module")
def small_vocab():
    return tiny_random_model("llama", seed=0, vocab_size=VOCAB, initializer_range=0.05)


def draw_rows(model, lookahead, sampling, n):
    counts = [dict() for _ in SAMPLE_PROMPTS]
    multi = 0
    for seed in range(0, n * len(SAMPLE_PROMPTS), len(SAMPLE_PROMPTS)):    # row b draws seeds b, b+3, ...
        outs = decode_batch(model, SAMPLE_PROMPTS, lookahead, DecodeLimits(max_new_tokens=DEPTH),
                            SamplingConfig(sampling.temperature, sampling.top_k, sampling.top_p, seed=seed))
        for row, out in zip(counts, outs):
            row[tuple(out.tokens)] = row.get(tuple(out.tokens), 0) + 1
            multi += any(a > 1 for a in out.stats.accepted)
    return counts, multi


def test_sampled_rows_keep_the_model_distribution(small_vocab):
    sampling = SamplingConfig(temperature=0.9, top_k=4)
    counts, multi = draw_rows(small_vocab, SAMPLE_TREE, sampling, DRAWS)
    assert multi > DRAWS // 10, "drafts were rarely accepted: the verifier was hardly exercised"
    for prompt, row in zip(SAMPLE_PROMPTS, counts):
        assert chi_square_pvalue(row, exact_distribution(small_vocab, sampling, prompt), DRAWS) > 1e-3, prompt


def test_the_batch_test_has_teeth_a_verifier_that_always_accepts_fails(small_vocab, monkeypatch):
    sampling = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(decoder_module, "make_verifier", always_accept_verifier)
    counts, _ = draw_rows(small_vocab, SAMPLE_TREE, sampling, DRAWS)
    for prompt, row in zip(SAMPLE_PROMPTS, counts):
        assert chi_square_pvalue(row, exact_distribution(small_vocab, sampling, prompt), DRAWS) < 1e-6, prompt


def test_a_batch_starts_from_the_prior_as_decode_does(llama):
    """``decode_batch(prior=...)`` cuts every row's cost-aware tree by the prior's rates, exactly as
    ``decode`` does with ``state.drafts``: the same steps, each feeding the same tokens; without the
    prior the same rows feed less (the guesses undervalue the copies)."""
    from lookahead_core import DecodeState, DraftStats

    costs = (1.0, 2.27, 3.01, 1.91, 2.0, 2.07, 2.2, 2.33, 2.4, 2.5, 2.55, 2.6, 2.7, 2.8, 2.85, 2.9, 2.95)
    config = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 1}, depth=16,
                             budget=17, step_costs=costs)
    learnt = DraftStats()
    for tag in (f"suffix:{b}:c{c}" for b in (1, 2, 3, 4, 8, 16, 32) for c in (1, 2, 3)):
        for depth in range(1, 17):
            learnt.counts.tried[tag, depth], learnt.counts.accepted[tag, depth] = 50, 45
    prompts = prompts_for(llama.config.vocab_size, lengths=(14, 37))
    prompts = [p * 3 for p in prompts]                      # copies for the suffix drafts to find
    limits = DecodeLimits(max_new_tokens=NEW)
    warm = decode_batch(llama, prompts, config, limits, prior=learnt)
    cold = decode_batch(llama, prompts, config, limits)
    for prompt, row, cold_row in zip(prompts, warm, cold):
        alone = decode(llama, prompt, config, limits, state=DecodeState(None, [], drafts=learnt))
        assert row.tokens == alone.tokens == cold_row.tokens == generate_alone(llama, prompt)
        assert row.stats.step_tokens == alone.stats.step_tokens and row.stats.drafts.prior is learnt
        assert sum(row.stats.step_tokens) > sum(cold_row.stats.step_tokens)


def test_recycled_successors_carry_to_the_next_decode_and_batch_without_being_written_back(llama):
    """Token Recycling's table outlasts a decode through ``DraftStats.carried``: a decode from
    the learnt prior drafts recycled successors from its first step (a cold one has none to draft),
    ``decode_batch`` starts every row from the same table, every output equals greedy, and the
    prior's table is read, never written (repeats from one prior start alike)."""
    import copy

    from lookahead_core import DecodeState

    config = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, sources={"recycle": 4}, depth=4,
                             budget=9)
    limits = DecodeLimits(max_new_tokens=NEW)
    prompts = prompts_for(llama.config.vocab_size, lengths=(14, 37))
    first = decode(llama, prompts[0], config, limits)
    learnt = first.stats.drafts.learnt()
    assert learnt.carried["recycle"] and learnt.carried["recycle"] == first.stats.drafts.carried["recycle"]
    before = copy.deepcopy(learnt.carried["recycle"])
    cold = decode(llama, prompts[0], config, limits)
    warm = decode(llama, prompts[0], config, limits, state=DecodeState(None, [], drafts=learnt))
    batch = decode_batch(llama, prompts, config, limits, prior=learnt)
    assert warm.tokens == cold.tokens == batch[0].tokens == generate_alone(llama, prompts[0])
    assert batch[1].tokens == generate_alone(llama, prompts[1])
    assert cold.stats.step_tokens[0] == 1 < warm.stats.step_tokens[0] == batch[0].stats.step_tokens[0]
    assert warm.stats.accepted[0] > 1                   # the table's top successors are greedy's own
    assert learnt.carried["recycle"] == before       # read, never written
    assert warm.stats.drafts.learnt().carried["recycle"].keys() >= before.keys()
