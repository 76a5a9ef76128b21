"""EAGLE drafters (lookahead_core/eagle.py): the tree they grow is verified like any draft, so decoding
stays token-identical to greedy in fp32 on the tiny families, alone and mixed with the other sources,
in a batch and across turns; sampling keeps the model's distribution; the drafter's cache holds
exactly the committed text; its time is counted apart; a base it cannot be built on is refused."""

from __future__ import annotations


import pytest
import torch

from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, SamplingConfig, decode, decode_batch
from experiments.config.labels import config_label
from lookahead_core.drafts import StepOutcome
from lookahead_core.eagle import EagleDrafter, EagleSource
from lookahead_core.sources import SOURCES, register_source, unregister_source
from experiments.models.tiny import tiny_random_model
from test_medusa import OutcomeSpy, prompt_for, refused_in_one_line, resumes_from_step_6_to_9
from tiny_families import tiny_family_model

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "olmo2", "granite", "cohere", "stablelm",
            "starcoder2", "gpt_neox"]  # fmt: skip
NEW = 40
EAGLE = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=4, sources={"eagle": 12})
CONFIGS = [
    EAGLE,                                                                    # the drafter alone
    LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True, tree=True, depth=4,
                    budget=10, sources={"eagle": 8, "suffix": 4, "recycle": 4}),   # mixed with every source, a budget
    LookaheadConfig(window=4, ngram=4, guess=4, tree=True, depth=3, sources={"eagle": 6}),   # beside a window
]


def drafter_for(model, kind: str, seed: int = 0) -> EagleDrafter:
    """``repeat``: fc passes the feature through and the layer adds nothing, so the drafter predicts
    the feature it was given: its first draft is the token the base chose last, again (accepted
    wherever the output repeats a token), the teeth of the comparisons; ``random``: random weights."""
    torch.manual_seed(seed)
    drafter = EagleDrafter(model)
    if kind == "repeat":
        hidden = model.config.hidden_size
        with torch.no_grad():
            drafter.fc.weight.zero_()
            drafter.fc.weight[:, hidden:] = torch.eye(hidden)
            drafter.fc.bias.zero_()
            for name, p in drafter.layer.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight", "dense.weight", "dense_4h_to_h.weight",
                                  "c_proj.weight", "o_proj.bias", "down_proj.bias", "dense.bias", "c_proj.bias")):
                    p.zero_()
    return drafter


def assert_trees_equal_greedy(model, drafters: dict) -> None:
    """With each drafter (``{kind: drafter}``), every config of ``CONFIGS`` decodes greedy's tokens,
    the drafter proposes, its time is counted, and some draft of it is accepted somewhere (teeth)."""
    reference_lm = CausalLM(model)
    accepted = 0
    for kind, drafter in drafters.items():
        lm = CausalLM(model, drafters={"eagle": drafter})
        for p, config in enumerate(CONFIGS):
            prompt = prompt_for(model.config.vocab_size, p)
            reference = decode(reference_lm, prompt, None, DecodeLimits(max_new_tokens=NEW)).tokens
            out = decode(lm, prompt, config, DecodeLimits(max_new_tokens=NEW))
            assert out.tokens == reference, (type(model).__name__, kind, config)
            table = {(r["source"], r["depth"]): r for r in out.stats.drafts.counts.table()}
            assert table[("eagle", 1)]["fed"] > 0, "the drafter proposed nothing"
            assert out.stats.draft_seconds > 0
            accepted += sum(r["accepted"] for (s, _), r in table.items() if s == "eagle")
    assert accepted > 0, "no EAGLE draft was ever accepted: the comparison had no teeth"


@pytest.mark.parametrize("family", FAMILIES)
def test_eagle_trees_equal_greedy_on_the_tiny_families(family):
    model = tiny_family_model(family, seed=3)
    assert_trees_equal_greedy(model, {kind: drafter_for(model, kind) for kind in ("repeat", "random")})


def test_decode_batch_with_eagle_equals_each_sequence_alone():
    model = tiny_random_model("llama", seed=2)
    lm = CausalLM(model, drafters={"eagle": drafter_for(model, "repeat")})
    prompts = [prompt_for(128, s, length) for s, length in ((0, 9), (1, 30), (2, 17))]
    limits = DecodeLimits(max_new_tokens=NEW)
    batch = decode_batch(lm, prompts, CONFIGS[1], limits)
    for prompt, out in zip(prompts, batch):
        alone = decode(lm, prompt, CONFIGS[1], limits)
        assert out.tokens == alone.tokens == decode(model, prompt, None, limits).tokens
        assert out.stats.accepted == alone.stats.accepted


def test_a_second_turn_with_eagle_equals_a_fresh_decode():
    """The second turn reuses the base's cache: the drafter starts from the first uncached position."""
    model = tiny_random_model("llama", seed=4)
    lm = CausalLM(model, drafters={"eagle": drafter_for(model, "repeat")})
    limits = DecodeLimits(max_new_tokens=24)
    turn1 = prompt_for(128, 7, 20)
    first = decode(lm, turn1, CONFIGS[1], limits)
    turn2 = turn1 + first.tokens + [3, 1, 4, 1, 5]
    second = decode(lm, turn2, CONFIGS[1], limits, state=first.state)
    assert second.stats.prefill_tokens == 6
    assert second.tokens == decode(model, turn2, None, limits).tokens


def test_the_next_turn_resumes_the_drafter_on_the_whole_conversation():
    """The drafter's cache travels with the conversation (``DecodeState.sources``): after a second
    turn it holds every (token, feature) pair of the whole text, as one pass over it gives them. A
    turn that edits the earlier text starts the drafter afresh at the first uncached position.
    Every output equals greedy's."""
    model = tiny_random_model("llama", seed=4)
    drafter = drafter_for(model, "random", seed=1)
    lm = CausalLM(model, drafters={"eagle": drafter})
    limits = DecodeLimits(max_new_tokens=24)
    turn1 = prompt_for(128, 7, 20)
    first = decode(lm, turn1, CONFIGS[1], limits)
    assert first.state.sources["eagle"]["next"] == len(turn1 + first.tokens) - 1
    turn2 = turn1 + first.tokens + [3, 1, 4, 1, 5]
    second = decode(lm, turn2, CONFIGS[1], limits, state=first.state.copy())
    assert second.tokens == decode(model, turn2, None, limits).tokens
    text = turn2 + second.tokens
    handed = second.state.sources["eagle"]
    assert (handed["first"], handed["next"]) == (0, len(text) - 1)
    with torch.inference_mode():
        features = model(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0]
    whole = EagleSource(drafter, size=10, depth=4)
    whole.update(StepOutcome(text, len(text), text[-1], features=features[:-1]))
    for kept, one_pass in zip(handed["cache"].layers, whole.cache.layers):
        torch.testing.assert_close(kept.keys, one_pass.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(kept.values, one_pass.values, atol=1e-4, rtol=1e-4)
    edited = list(turn2)
    edited[5] = (edited[5] + 1) % 128
    third = decode(lm, edited, CONFIGS[1], limits, state=first.state.copy())
    assert third.tokens == decode(model, edited, None, limits).tokens
    assert third.state.sources["eagle"]["first"] == 5                # afresh from the edit
    other = CausalLM(model, drafters={"eagle": drafter_for(model, "random", seed=2)})
    fourth = decode(other, turn2, CONFIGS[1], limits, state=first.state.copy())
    assert fourth.tokens == second.tokens and fourth.state.sources["eagle"]["first"] == len(turn1 + first.tokens) - 1


def test_each_update_hands_the_features_of_the_rows_that_chose_the_committed_tokens():
    """``StepOutcome.features``: after the prefill every prompt row's last hidden state, after a step
    the input row's and the accepted path's, in order: as one forward over the whole text gives them."""
    register_source("fspy", label="fspy", features=True)(OutcomeSpy)
    try:
        OutcomeSpy.seen = []
        model = tiny_random_model("llama", seed=5)
        prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 7, 8, 3, 4]
        config = LookaheadConfig(window=1, ngram=3, guess=3, pool_only=True, tree=True, sources={"suffix": 3, "fspy": 1})
        out = decode(model, prompt, config, DecodeLimits(max_new_tokens=30))
        assert max(out.stats.accepted) > 1, "no multi-token step: the rows of a path were not exercised"
        with torch.inference_mode():
            full = model(torch.tensor([prompt + out.tokens]), output_hidden_states=True).hidden_states[-1][0]
        assert len(OutcomeSpy.seen[0][2]) == len(prompt)
        covered = []
        for context, _, features in OutcomeSpy.seen:
            first = len(context) - 1 - len(features)
            covered += range(first, len(context) - 1)
            torch.testing.assert_close(features, full[first:len(context) - 1], atol=1e-5, rtol=1e-5)
        assert covered == list(range(len(prompt) + len(out.tokens) - 1))   # every position once, in order
    finally:
        unregister_source("fspy")


def test_the_drafter_cache_holds_exactly_the_committed_text():
    """Updates in pieces, with trees grown (and cut) in between, leave the drafter where one pass over
    the whole text leaves it: the same prediction for the next position."""
    model = tiny_random_model("llama", seed=6)
    drafter = drafter_for(model, "random", seed=1)
    text = prompt_for(128, 3, 30)
    with torch.inference_mode():
        features = model(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0]
    pieces = EagleSource(drafter, size=10, depth=4)
    at = 12
    pieces.update(StepOutcome(text[:at + 1], at + 1, text[at], features=features[:at]))
    for end in (15, 16, 21, 29):
        assert pieces.propose(text[:at + 1])
        pieces.update(StepOutcome(text[:end + 1], at + 1, text[at], features=features[at:end]))
        at = end
    whole = EagleSource(drafter, size=10, depth=4)
    whole.update(StepOutcome(text, len(text), text[-1], features=features[:-1]))
    torch.testing.assert_close(pieces.root, whole.root, atol=1e-5, rtol=1e-5)
    assert pieces.cache.get_seq_length() == whole.cache.get_seq_length() == len(text) - 1


def test_the_tree_is_the_best_nodes_of_the_drafters_own_expansion():
    model = tiny_random_model("llama", seed=6)
    source = EagleSource(drafter_for(model, "random", seed=2), size=7, depth=3, width=3)
    text = prompt_for(128, 4, 16)
    with torch.inference_mode():
        features = model(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0]
    source.update(StepOutcome(text, len(text), text[-1], features=features[:-1]))
    drafts = source.propose(text)
    nodes = {d.tokens[:k] for d in drafts for k in range(1, len(d.tokens) + 1)}
    assert len(nodes) == 7 and max(len(d.tokens) for d in drafts) <= 3
    first = torch.topk(source.drafter.log_probs(source.root[None])[0], 3).indices.tolist()
    assert {n[0] for n in nodes} <= set(first) and (first[0],) in nodes      # the best first token is kept
    assert all(t.startswith("eagle:p") for d in drafts for t in d.tags)


def test_eagle_sampling_keeps_the_distribution():
    """Recursive rejection over the drafter's tree: the first 3 tokens' distribution is the model's."""
    from test_sampling import DRAWS, VOCAB, chi_square_pvalue, draw, exact_distribution

    model = tiny_random_model("llama", seed=0, vocab_size=VOCAB, initializer_range=0.05)
    lm = CausalLM(model, drafters={"eagle": drafter_for(model, "repeat")})
    sampling = SamplingConfig(temperature=1.0)
    probs = exact_distribution(model, sampling)
    counts, multi = draw(lm, EAGLE, sampling)
    assert multi > DRAWS // 10, "the drafter's tree was rarely accepted: the verifier was hardly exercised"
    assert chi_square_pvalue(counts, probs, DRAWS) > 1e-3


@pytest.mark.parametrize("family,why", [("gemma3", "per-layer rotary"), ("gpt2", "no list of decoder layers"),
                                        ("opt", "not rotary")])
def test_a_base_the_drafter_cannot_be_built_on_is_refused(family, why):
    with pytest.raises(ValueError, match=why):
        EagleDrafter(tiny_family_model(family, seed=0))


def test_an_eagle_config_without_a_drafter_is_refused_and_eagle_is_named_in_labels():
    model = tiny_random_model("llama", seed=0)
    with pytest.raises(ValueError, match=r"drafters=\{'eagle'"):
        decode(model, [1, 2, 3], EAGLE, DecodeLimits(max_new_tokens=4))
    assert SOURCES["eagle"].features and SOURCES["eagle"].drafter
    assert "_eg12" in config_label(EAGLE)


# ---------------------------------------------------------------------------------------------
# EAGLE's published layout


def write_official(folder, model, drafter: EagleDrafter, *, weights: str = "pytorch_model.bin", embed: bool = True,
                   **config_changes) -> dict:
    """A checkpoint in EAGLE-1/2's published layout, written by hand (not by ``save_drafter``): a
    Llama-style config.json with one layer and ``bias``, flat keys ``fc.*`` and ``layers.0.*``, and
    the base's embeddings as EAGLE-1 ships them."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": True, "num_hidden_layers": 1,
              **{k: getattr(model.config, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                       "num_key_value_heads", "vocab_size", "rms_norm_eps")}}
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    state = {"fc.weight": drafter.fc.weight.detach().clone(), "fc.bias": drafter.fc.bias.detach().clone()}
    state |= {f"layers.0.{k}": v.detach().clone() for k, v in drafter.layer.state_dict().items()}
    if embed:
        state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    if weights.endswith(".bin"):
        torch.save(state, folder / weights)
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / weights))
    return state


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.safetensors"])
def test_a_checkpoint_in_eagles_layout_loads_and_drafts_as_its_weights_say(tmp_path, weights):
    from lookahead_core.eagle import load_drafter

    model = tiny_random_model("llama", seed=8)
    original = drafter_for(model, "random", seed=5)
    state = write_official(tmp_path / "eagle", model, original, weights=weights)
    loaded = load_drafter(tmp_path / "eagle", model)
    assert loaded.layer.input_layernorm.__class__ is torch.nn.Identity
    for key, value in state.items():
        if key.startswith("fc."):
            torch.testing.assert_close(getattr(loaded.fc, key[3:]), value)
        elif key.startswith("layers.0."):
            torch.testing.assert_close(loaded.layer.state_dict()[key[9:]], value)
    prompt = prompt_for(128, 9)
    runs = [decode(CausalLM(model, drafters={"eagle": d}), prompt, CONFIGS[1], DecodeLimits(max_new_tokens=NEW))
            for d in (original, loaded)]
    assert runs[0].tokens == runs[1].tokens == decode(model, prompt, None, DecodeLimits(max_new_tokens=NEW)).tokens
    assert runs[0].stats.accepted == runs[1].stats.accepted        # the same drafts, step by step


def test_a_drafter_saved_here_loads_again_and_decodes_the_same_tokens(tmp_path):
    from lookahead_core.eagle import load_drafter, save_drafter

    model = tiny_random_model("llama", seed=8)
    drafter = drafter_for(model, "repeat")
    save_drafter(drafter, tmp_path / "mine", training={"steps": 3})
    loaded = load_drafter(tmp_path / "mine", model)
    assert loaded.training_record == {"steps": 3}
    prompt = prompt_for(128, 2)
    runs = [decode(CausalLM(model, drafters={"eagle": d}), prompt, EAGLE, DecodeLimits(max_new_tokens=NEW))
            for d in (drafter, loaded)]
    assert runs[0].tokens == runs[1].tokens and runs[0].stats.accepted == runs[1].stats.accepted


@pytest.mark.parametrize("change,why", [
    ({"hidden_size": 32}, "hidden_size=32"),
    ({"vocab_size": 1000}, "vocab_size=1000"),
    ({"num_hidden_layers": 2}, "2 layers"),
], ids=["hidden", "vocab", "layers"])
def test_a_checkpoint_for_another_base_is_refused(tmp_path, change, why):
    from lookahead_core.eagle import load_drafter

    model = tiny_random_model("llama", seed=8)
    write_official(tmp_path / "eagle", model, drafter_for(model, "random"), **change)
    with pytest.raises(ValueError, match=why):
        load_drafter(tmp_path / "eagle", model)


def test_a_checkpoint_whose_weights_do_not_fit_is_refused(tmp_path):
    from lookahead_core.eagle import load_drafter

    model = tiny_random_model("llama", seed=8)
    other = tiny_random_model("llama", seed=9)
    write_official(tmp_path / "embed", other, drafter_for(other, "random"))      # another model's embeddings
    with pytest.raises(ValueError, match="embed_tokens.weight that is not the base's own"):
        load_drafter(tmp_path / "embed", model)
    state = write_official(tmp_path / "short", model, drafter_for(model, "random"), embed=False)
    state.pop("layers.0.mlp.down_proj.weight")
    torch.save(state, tmp_path / "short" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="missing .*down_proj"):
        load_drafter(tmp_path / "short", model)
    with pytest.raises(ValueError, match="no config.json"):
        load_drafter(tmp_path / "nothing", model)


def test_a_dense_eagle1_layer_for_a_mixture_of_experts_base_is_refused_naming_why(tmp_path):
    """EAGLE-1/2's layer is the base's own architecture; Mixtral's published drafter is a dense
    (Llama) layer, which a Mixtral base's layer (its experts) is not: refused, saying so."""
    from lookahead_core.eagle import load_drafter

    mixtral, llama = tiny_family_model("mixtral", seed=8), tiny_family_model("llama", seed=8)
    write_official(tmp_path / "dense", mixtral, drafter_for(llama, "random"), embed=False)
    with pytest.raises(ValueError, match=r"dense layer for a mixture-of-experts base \(MixtralForCausalLM, "
                                         r"num_local_experts=4\).*not served"):
        load_drafter(tmp_path / "dense", mixtral)


# ---------------------------------------------------------------------------------------------
# Training here: python -m experiments.tools.eagle


def test_training_saves_a_drafter_with_its_curve_and_acceptance_and_resumes(tmp_path, capsys, monkeypatch):
    import json
    import sys

    from experiments.tools import distill
    from experiments.tools import eagle as tool
    from lookahead_core.eagle import load_drafter

    out = tmp_path / "eagle"
    args = ["eagle", "model=tiny_llama", f"out={out}", "tokens=6000", "batch=2", "eval_every=3", "depth=3",
            "draft_vocab=40", "version=1"]
    monkeypatch.setattr(sys, "argv", args + ["steps=6"])
    tool.main()
    config = json.loads((out / "config.json").read_text())
    record = config["training"]
    assert config["num_hidden_layers"] == 1 and record["corpus"] == distill.CORPUS and record["steps"] == 6
    assert len(record["acceptance"]) == 3 and all(0 <= a <= 1 for a in record["acceptance"])
    assert config["draft_vocab_size"] == record["draft_vocab"] == 40 and 0 < record["draft_vocab_coverage"] < 1
    assert record["acceptance"] == sorted(record["acceptance"], reverse=True)        # a chain only shortens
    curve = (out / "curve.csv").read_text().splitlines()
    assert len(curve) == 1 + 6 and "heldout_accept_3" in curve[0] and (out / "curve.png").stat().st_size > 0
    resumes_from_step_6_to_9(tool.main, args, out, capsys, monkeypatch)
    model = tiny_random_model("llama")
    loaded = load_drafter(out, model)
    assert isinstance(loaded, EagleDrafter) and len(loaded.vocab) == 40 and record["version"] == 1
    lm = CausalLM(model, drafters={"eagle": loaded})
    prompt = prompt_for(128, 9)
    assert decode(lm, prompt, EAGLE, DecodeLimits(max_new_tokens=20)).tokens == \
        decode(model, prompt, None, DecodeLimits(max_new_tokens=20)).tokens


@pytest.mark.parametrize("override, key", [("tokens=-5", "tokens"), ("ce_weight=0", "ce_weight"),
                                           ("depth=300", "depth"), ("draft_vocab=-1", "draft_vocab"),
                                           ("model=nowhere", "model"), ("version=2", "version"), ("ttt=0", "ttt"),
                                           ("version=1 layer_ids=[1,2]", "layer_ids"), ("layer_ids=[-1]", "layer_ids")])
def test_a_bad_training_config_is_refused_in_one_line_naming_the_key(override, key):
    refused_in_one_line("experiments.tools.eagle", override, key)


def test_a_reduced_draft_vocabulary_drafts_only_its_tokens_losslessly_and_round_trips(tmp_path):
    """The head scores only the draft vocabulary's rows (the base's own, sliced), the tree holds only
    its tokens, decoding stays greedy's, and the vocabulary travels as EAGLE-3's ``d2t``."""
    from lookahead_core.eagle import load_drafter, save_drafter

    model = tiny_random_model("llama", seed=8)
    vocab = list(range(0, 128, 3))
    drafter = EagleDrafter(model, vocab=vocab)
    full = EagleDrafter(model)
    full.load_state_dict(drafter.state_dict())
    features = torch.randn(2, model.config.hidden_size)
    torch.testing.assert_close(drafter.log_probs(features).exp().sum(-1), torch.ones(2))
    ranked = drafter.token_ids(drafter.log_probs(features).argsort(-1, descending=True))
    in_full = full.log_probs(features)[:, vocab].argsort(-1, descending=True)
    assert ranked.tolist() == torch.tensor(vocab)[in_full].tolist()          # the same order as the full head's
    source = EagleSource(drafter, size=12, depth=4)
    text = prompt_for(128, 5, 20)
    with torch.inference_mode():
        hidden = model(torch.tensor([text]), output_hidden_states=True).hidden_states[-1][0]
    source.update(StepOutcome(text, len(text), text[-1], features=hidden[:-1]))
    assert {t for d in source.propose(text) for t in d.tokens} <= set(vocab)
    lm = CausalLM(model, drafters={"eagle": drafter})
    prompt = prompt_for(128, 6)
    assert decode(lm, prompt, CONFIGS[1], DecodeLimits(max_new_tokens=NEW)).tokens == \
        decode(model, prompt, None, DecodeLimits(max_new_tokens=NEW)).tokens
    save_drafter(drafter, tmp_path / "small")
    assert load_drafter(tmp_path / "small", model).vocab.tolist() == vocab
    with pytest.raises(ValueError, match="distinct token ids"):
        EagleDrafter(model, vocab=[1, 1, 2])
