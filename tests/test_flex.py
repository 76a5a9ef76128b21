"""The flex_attention path: block masks that equal the dense mask cell by cell, and decodes that equal
greedy token for token in fp32 on the four families (sliding windows included)."""

import random
import warnings

import pytest
import torch

from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, decode, decode_batch, probe
from lookahead_core.flex import BLOCK, FALLBACK_WARNING, NO_WINDOW, FlexMasks, block_tables, rearm_fallback_warning
from lookahead_core.layout import attention_mask, causal_layout, chains, step_layout
from experiments.models.loader import tiny_random_model
from test_lossless import TREE_GRID, greedy, repetitive_prompt
from tiny_families import PASSING, tiny_family_model

ARCHS = ("llama", "mistral", "qwen2", "gemma3")
NEW = 40


def block_mask_cells(mask, rows: int, total: int) -> torch.Tensor:
    """(B, rows, total) bool: what flex computes from ``mask`` — every cell of a full block, the
    ``mask_mod`` on a partial block's cells, nothing elsewhere."""
    batch = mask.kv_num_blocks.shape[0]
    b = torch.arange(batch)[:, None, None]
    q = torch.arange(rows)[None, :, None]
    kv = torch.arange(total)[None, None, :]
    rule = mask.mask_mod(b, torch.zeros(()), q, kv).expand(batch, rows, total)
    full = torch.zeros(batch, rows, total, dtype=torch.bool)
    partial = torch.zeros_like(full)
    for counts, indices, into in ((mask.full_kv_num_blocks, mask.full_kv_indices, full),
                                  (mask.kv_num_blocks, mask.kv_indices, partial)):
        for s in range(batch):
            for qb in range(counts.shape[-1]):
                for kb in indices[s, 0, qb, :int(counts[s, 0, qb])].tolist():
                    into[s, qb * BLOCK:(qb + 1) * BLOCK, kb * BLOCK:(kb + 1) * BLOCK] = True
    assert not (full & partial).any(), "a block is both full and partial"
    return full | (partial & rule)


def random_parents(rng: random.Random, nodes: int) -> tuple[int, ...]:
    return tuple(rng.randrange(-1, i) for i in range(nodes))


def random_step(rng: random.Random):
    """(offsets, visible) of a random step: a window and a random tree, or a tree alone."""
    window = rng.choice([0, 1, 3, 7, 15])
    levels = rng.randrange(1, 5) if window else 0
    layout = step_layout(window, levels, random_parents(rng, rng.randrange(0, 40)))
    return layout.offsets, layout.visible


@pytest.mark.parametrize("seed", range(80))
def test_block_masks_equal_the_dense_mask_cell_by_cell(seed):
    rng = random.Random(seed)
    batch = rng.choice([1, 1, 2, 3])
    past = rng.choice([0, 5, 127, 128, 129, 300, 700])
    steps = [random_step(rng) for _ in range(batch)]
    chain = rng.random() < 0.2
    if chain:                                           # the prefill or a greedy step: a causal chain
        rows = rng.choice([1, 2, 200, 300])
        steps = [causal_layout(rows)] * batch
    rows = max(len(o) for o, _ in steps)
    offsets = torch.zeros(batch, rows, dtype=torch.long)
    visible = torch.eye(rows, dtype=torch.bool).repeat(batch, 1, 1)      # padding rows see themselves
    for s, (o, v) in enumerate(steps):
        offsets[s, :len(o)], visible[s, :len(o), :len(o)] = o, v
    # A batch: sequence s has valid[s] committed slots and feeds its step from there.
    valid = torch.tensor([past] + [rng.randrange(0, past + 1) for _ in range(batch - 1)]) if not chain \
        else torch.full((batch,), past)
    flex = FlexMasks(torch.device("cpu"))
    for window in (None, rng.choice([1, 4, 50, 200])):
        dense = attention_mask(offsets, visible, past, valid, sliding_window=window, dtype=torch.float32,
                               valid=valid)[:, 0] == 0
        masks = flex.masks({"layer": window}, past, valid, None if chain else offsets,
                           None if chain else visible, rows)
        cells = block_mask_cells(masks["layer"], rows, past + rows)
        assert torch.equal(cells, dense), f"seed {seed} window {window}"


def test_block_tables_skip_what_no_row_sees():
    """The committed context is whole blocks computed without a mask; a sliding window hides the
    blocks behind it; the step's own rows are always partial."""
    past = 5 * BLOCK
    query_pos = past + torch.arange(10)[None]
    full, partial = block_tables(past, torch.tensor([past]), query_pos, None)
    assert full[0, 0].tolist() == [True] * 5 + [False] and partial[0, 0].tolist() == [False] * 5 + [True]
    full, partial = block_tables(past, torch.tensor([past]), query_pos, 2 * BLOCK)
    hidden = ~(full | partial)
    assert hidden[0, 0, :2].all() and partial[0, 0, -1] and full[0, 0].sum() == 1
    # A sequence of a batch with fewer committed slots than the cache: its later slots are hidden.
    full, partial = block_tables(past, torch.tensor([past, 2 * BLOCK]), query_pos.expand(2, -1), None)
    assert full[1, 0].tolist() == [True, True] + [False] * 4
    assert partial[1, 0].tolist() == [False] * 5 + [True]


@pytest.fixture(scope="module", params=ARCHS)
def flex_pair(request):
    """(arch, sdpa model, flex model): the same weights, a sliding window of 8 where the family has one."""
    arch = request.param
    window = None if arch == "llama" else 8
    torch._dynamo.reset()          # each family compiles its own kernels, within the recompile limit
    return (arch, tiny_random_model(arch, seed=1, sliding_window=window),
            CausalLM(tiny_random_model(arch, seed=1, sliding_window=window, attn_implementation="flex_attention")))


def test_flex_decodes_equal_greedy(flex_pair):
    """Linear branches, the prompt pool and token trees on the flex path; prompts longer than the
    sliding window; no step falls back to uncompiled flex (the recompiles stay bounded)."""
    arch, sdpa, flex = flex_pair
    assert flex.attention == "flex_attention" and flex.flex is not None
    limits = DecodeLimits(max_new_tokens=NEW)
    counts = [0, 0]
    rearm_fallback_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for length, seed in ((24, 0), (40, 1)):
            prompt = repetitive_prompt(sdpa.config.vocab_size, length=length, seed=seed)
            reference = greedy(sdpa, prompt, limits)
            configs = [None, LookaheadConfig(4, 3, 4), LookaheadConfig(6, 5, 12, prompt_pool=True),
                       LookaheadConfig(1, 2, 1), *TREE_GRID[1:4], TREE_GRID[9], TREE_GRID[-1]]
            for config in configs:
                out = decode(flex, prompt, config, limits)
                counts[0] += out.tokens == reference
                counts[1] += 1
                assert out.tokens == reference, f"{arch} {config}"
    assert counts[0] == counts[1] == 18
    fallbacks = [w for w in caught if FALLBACK_WARNING in str(w.message)]
    assert not fallbacks, f"{arch}: flex_attention ran uncompiled (recompile limit reached)"


def test_flex_batches_equal_greedy(flex_pair):
    arch, sdpa, flex = flex_pair
    vocab = sdpa.config.vocab_size
    prompts = [repetitive_prompt(vocab, length=n, seed=n) for n in (3, 14, 37)]
    limits = DecodeLimits(max_new_tokens=NEW)
    references = [greedy(sdpa, p, limits) for p in prompts]
    for config in (None, LookaheadConfig(4, 3, 4, prompt_pool=True), TREE_GRID[1]):
        outs = decode_batch(flex, prompts, config, limits)
        assert [o.tokens for o in outs] == references, f"{arch} {config}"


def test_the_probe_runs_on_the_flex_path(flex_pair):
    _, _, flex = flex_pair
    result = probe(flex)
    assert result.passed, result
    from lookahead_core.capability import _RESULTS
    assert (flex.dtype, str(flex.device), "flex_attention") in _RESULTS[flex.model]


def test_flex_logits_equal_sdpa_on_a_branching_step(flex_pair):
    """Beyond argmax: one step of a window and a tree after a context past the window."""
    arch, sdpa, flex = flex_pair
    dense = CausalLM(sdpa)
    prompt = repetitive_prompt(sdpa.config.vocab_size, length=30)
    layout = step_layout(4, 3, chains(3, 2))
    tokens = prompt[:layout.size]
    logits = []
    with torch.inference_mode():       # as decode runs (flex has no backward on the CPU)
        for lm in (dense, flex):
            cache = lm.new_cache()
            offsets, _ = causal_layout(len(prompt))
            lm.forward(cache, prompt, offsets, None, 0, torch.arange(len(prompt)))
            logits.append(lm.forward(cache, tokens, layout.offsets, layout.visible, len(prompt), layout.logit_rows))
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)


def test_what_cannot_run_flex_is_refused_before_any_decode(monkeypatch):
    """Architectures transformers has no flex path for fail when they load, naming flex_attention;
    a torch without flex_attention is refused by CausalLM, saying what to load instead."""
    import sys

    import transformers
    from transformers import AutoModelForCausalLM

    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=128)
    with pytest.raises(ValueError, match="flex_attention"):
        AutoModelForCausalLM.from_config(config, attn_implementation="flex_attention")
    model = tiny_random_model("llama", attn_implementation="flex_attention")
    monkeypatch.delitem(sys.modules, "lookahead_core.flex")
    monkeypatch.setitem(sys.modules, "torch.nn.attention.flex_attention", None)     # import fails
    with pytest.raises(ValueError, match="flex_attention needs torch.nn.attention.flex_attention.*sdpa or eager"):
        CausalLM(model)


def test_no_window_is_longer_than_any_context():
    assert NO_WINDOW > 1 << 40


# transformers has no flex path for these (the model refuses to load under flex_attention).
NO_FLEX = {"gpt2", "gpt_bigcode", "stablelm", "falcon_rotary", "persimmon"}


@pytest.mark.parametrize("family", sorted(PASSING))
def test_every_family_with_a_flex_path_passes_the_probe_and_equals_greedy(family):
    """The architectures the probe passes under SDPA, under flex_attention: those transformers gives
    a flex path pass the probe and decode greedy's tokens; the others fail to load, naming flex."""
    if family in NO_FLEX:
        with pytest.raises(ValueError, match="flex_attention"):
            tiny_family_model(family, attn_implementation="flex_attention", strict=True)
        return
    # No recompile-limit guard here (test_flex_decodes_equal_greedy has it): families that share
    # head shapes share kernels, and past the limit torch runs the same masks uncompiled.
    flex = CausalLM(tiny_family_model(family, attn_implementation="flex_attention", strict=True))
    assert flex.attention == "flex_attention" and probe(flex).passed
    sdpa = tiny_family_model(family)
    prompt = repetitive_prompt(sdpa.config.vocab_size, length=20)
    limits = DecodeLimits(max_new_tokens=16)
    assert decode(flex, prompt, LookaheadConfig(4, 3, 4, prompt_pool=True), limits).tokens == greedy(sdpa, prompt, limits)
