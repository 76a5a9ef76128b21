"""The flex_attention path: block masks that equal the dense mask cell by cell, and decodes that equal
greedy token for token in fp32 on the four families (sliding windows included).

torch compiles flex_attention for the device at hand, and on some CPUs (AVX2, torch 2.13) that kernel
is wrong. Every claim below runs where the backend runs right: compiled where this host's kernel
passes the core's attention check; where it does not, the test asserts the refusal (every decode
raises it before a token, naming the backend, the device and the cause) and runs the claim the way
out the refusal names, flex uncompiled. Which of the two ran is in each test's output."""

import random
import re
import warnings
from contextlib import contextmanager

import pytest
import torch

from lookahead_core import (CausalLM, DecodeLimits, LookaheadConfig, UnsupportedAttentionError, attention_verdict,
                            decode, decode_batch, probe)
from lookahead_core.capability import uncompiled
from lookahead_core.flex import BLOCK, FALLBACK_WARNING, NO_WINDOW, FlexMasks, block_tables, rearm_fallback_warning
from lookahead_core.layout import attention_mask, causal_layout, chains, step_layout
from experiments.models.tiny import tiny_random_model
from test_lossless import TREE_GRID, greedy, repetitive_prompt
from tiny_families import PASSING, tiny_family_model

ARCHS = ("llama", "mistral", "qwen2", "gemma3")
NEW = 40


def assert_refused_clearly(flex: CausalLM, verdict) -> None:
    """A refused backend: one message naming the backend, the device, the cause and the ways out,
    raised by every decode (greedy, lookahead, batches) before it returns anything."""
    message = str(verdict.error())
    assert message.startswith("attention 'flex_attention' computes wrong logits on this device (cpu, ")
    assert "\n" not in message and re.search(r"gave NaN logits where \w+ does not|gave logits \S+ away from \w+'s|crashed",
                                          verdict.cause), verdict.cause
    assert "attn_implementation='sdpa' (the reference here)" in message or \
        "attn_implementation='eager' (the reference here)" in message        # a model with no SDPA path
    for run in (lambda: decode(flex, [3, 4, 5], None, DecodeLimits(max_new_tokens=4)),
                lambda: decode(flex, [3, 4, 5], LookaheadConfig(3, 3, 3), DecodeLimits(max_new_tokens=4)),
                lambda: decode_batch(flex, [[3, 4, 5], [6, 7]], None, DecodeLimits(max_new_tokens=4))):
        with pytest.raises(UnsupportedAttentionError) as raised:
            run()
        assert str(raised.value) == message


@contextmanager
def where_flex_runs(flex: CausalLM):
    """Yields "compiled" where this host's compiled flex kernel is admitted; else asserts the clear
    refusal and yields "uncompiled" inside the way out it names (the backend must be right there)."""
    verdict = attention_verdict(flex)
    if verdict.passed:
        print(f"flex_attention compiled on {verdict.device}: admitted (max diff {verdict.max_diff:.2g})")
        yield "compiled"
        return
    assert_refused_clearly(flex, verdict)
    assert any("uncompiled (TORCHDYNAMO_DISABLE=1" in way for way in verdict.alternatives), verdict
    print(f"flex_attention compiled on {verdict.device}: refused ({verdict.cause}); the claim runs uncompiled")
    with uncompiled():
        assert attention_verdict(flex).passed
        yield "uncompiled"


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
    with warnings.catch_warnings(record=True) as caught, where_flex_runs(flex) as mode:
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
    if mode == "compiled":
        assert not fallbacks, f"{arch}: flex_attention ran uncompiled (recompile limit reached)"


def test_flex_batches_equal_greedy(flex_pair):
    arch, sdpa, flex = flex_pair
    vocab = sdpa.config.vocab_size
    prompts = [repetitive_prompt(vocab, length=n, seed=n) for n in (3, 14, 37)]
    limits = DecodeLimits(max_new_tokens=NEW)
    references = [greedy(sdpa, p, limits) for p in prompts]
    with where_flex_runs(flex):
        for config in (None, LookaheadConfig(4, 3, 4, prompt_pool=True), TREE_GRID[1]):
            outs = decode_batch(flex, prompts, config, limits)
            assert [o.tokens for o in outs] == references, f"{arch} {config}"


def test_the_probe_runs_on_the_flex_path(flex_pair):
    _, _, flex = flex_pair
    verdict = attention_verdict(flex)
    if not verdict.passed:      # the probe fails with the backend's reason, and its error is the backend's
        result = probe(flex)
        assert not result.passed and result.reasons == (verdict.cause,)
        assert isinstance(result.error(), UnsupportedAttentionError)
    with where_flex_runs(flex):
        result = probe(flex)
        assert result.passed, result
    from lookahead_core.capability import _RESULTS
    assert ("probe", flex.dtype, str(flex.device), "flex_attention") in _RESULTS[flex.model]


def test_flex_logits_equal_sdpa_on_a_branching_step(flex_pair):
    """Beyond argmax: one step of a window and a tree after a context past the window."""
    arch, sdpa, flex = flex_pair
    dense = CausalLM(sdpa)
    prompt = repetitive_prompt(sdpa.config.vocab_size, length=30)
    layout = step_layout(4, 3, chains(3, 2))
    tokens = prompt[:layout.size]
    logits = []
    with torch.inference_mode(), where_flex_runs(flex):       # as decode runs (flex has no backward on the CPU)
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
    sdpa = tiny_family_model(family)
    prompt = repetitive_prompt(sdpa.config.vocab_size, length=20)
    limits = DecodeLimits(max_new_tokens=16)
    with where_flex_runs(flex):
        assert flex.attention == "flex_attention" and probe(flex).passed
        assert decode(flex, prompt, LookaheadConfig(4, 3, 4, prompt_pool=True), limits).tokens == \
            greedy(sdpa, prompt, limits)


# The check itself, on every host: a flex backend broken on purpose (as torch's compiled CPU kernel is
# on AVX2: NaN or wrong values at some key lengths) is refused before any decode, greedy included.

def _broken_flex(monkeypatch, when, how, uncompiled_too: bool):
    """flex_attention, except that ``how(out)`` replaces its output on calls whose key length ``when``
    picks (compiled only, unless ``uncompiled_too``)."""
    from transformers.modeling_utils import AttentionInterface
    from lookahead_core.capability import compiling

    right = AttentionInterface._global_mapping["flex_attention"]

    def flex(module, query, key, value, attention_mask, **kwargs):
        out, weights = right(module, query, key, value, attention_mask, **kwargs)
        if when(key.shape[-2]) and (uncompiled_too or compiling()):
            out = how(out)
        return out, weights

    monkeypatch.setitem(AttentionInterface._global_mapping, "flex_attention", flex)


@pytest.mark.parametrize("broken,cause", [
    ((lambda kv: kv % 8 == 0, lambda out: out * float("nan")), "gave NaN logits where sdpa does not"),
    ((lambda kv: kv % 16 == 5, lambda out: out + 0.05), "away from sdpa's"),
    ((lambda kv: kv > 40, lambda out: out.flip(1)), "away from sdpa's"),
])
def test_a_backend_wrong_on_this_device_is_refused_before_any_decode(monkeypatch, broken, cause):
    """Wrong at some key lengths only, as the AVX2 kernel is: found by the check's decode of a whole
    period of key lengths, refused for every decoder, the cause and the ways out named."""
    with uncompiled():          # the real kernel out of the way: the breakage below is the only fault
        _broken_flex(monkeypatch, *broken, uncompiled_too=True)
        flex = CausalLM(tiny_random_model("llama", seed=1, attn_implementation="flex_attention"))
        verdict = attention_verdict(flex)
        assert not verdict.passed and cause in verdict.cause, verdict
        assert verdict.alternatives == ("attn_implementation='sdpa' (the reference here)",)
        assert "cpu, " in verdict.device and str(torch.backends.cpu.get_cpu_capability()) in verdict.device
        assert_refused_clearly(flex, verdict)
        assert not probe(flex).passed and isinstance(probe(flex).error(), UnsupportedAttentionError)


def test_a_backend_wrong_only_compiled_names_the_uncompiled_way_out(monkeypatch):
    """Wrong only where compiled (as on AVX2): the refusal says so and names TORCHDYNAMO_DISABLE=1,
    which it checked; uncompiled, the same model is admitted and decodes greedy's tokens."""
    _broken_flex(monkeypatch, lambda kv: kv % 8 == 0, lambda out: out * float("nan"), uncompiled_too=False)
    model = tiny_random_model("llama", seed=1, attn_implementation="flex_attention")
    flex = CausalLM(model)
    with uncompiled():
        reference = greedy(tiny_random_model("llama", seed=1), list(range(3, 30)), DecodeLimits(max_new_tokens=24))
    verdict = attention_verdict(flex)
    assert not verdict.passed and "run uncompiled it is right" in verdict.cause
    assert verdict.alternatives[1].startswith("flex_attention uncompiled (TORCHDYNAMO_DISABLE=1")
    with uncompiled():
        assert attention_verdict(flex).passed
        assert decode(flex, list(range(3, 30)), LookaheadConfig(4, 3, 4), DecodeLimits(max_new_tokens=24)).tokens \
            == reference


def test_eager_and_sdpa_are_admitted_unchecked():
    for attention in ("eager", "sdpa"):
        verdict = attention_verdict(tiny_random_model("llama", attn_implementation=attention))
        assert verdict.passed and verdict.max_diff == 0.0 and verdict.device == "cpu"
