"""EAGLE-3 drafters (lookahead_core/eagle.py: Eagle3Drafter): the base's hidden states after three of
its layers fused, a Llama layer of its own, its own head over a draft vocabulary. The tree it grows
is verified like any draft, so decoding stays token-identical to greedy in fp32 on the tiny
families (bases EAGLE-1 cannot serve included: its layer is not the base's), alone and mixed, in a
batch and across turns; sampling keeps the distribution; the step hands it exactly the layers it
reads. Its three published layouts (the official one, SpecForge's, vLLM speculators') load from
fixtures written here by hand, a drafter saved here loads again, and a checkpoint for another base
is refused with the reason."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from lookahead_core import CausalLM, DecodeLimits, SamplingConfig, decode, decode_batch
from experiments.config.labels import config_label
from lookahead_core.drafts import StepOutcome
from lookahead_core.eagle import Eagle3Drafter, EagleSource, default_layer_ids, eagle3_config, load_drafter, save_drafter
from lookahead_core.sources import register_source, unregister_source
from experiments.models.tiny import tiny_random_model
from test_eagle import CONFIGS, EAGLE, NEW, assert_trees_equal_greedy
from test_medusa import OutcomeSpy, prompt_for
from tiny_families import tiny_family_model

FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "phi3", "gpt_neox", "cohere",
            "gpt2", "opt", "gemma3"]            # the last three: bases EAGLE-1's own-architecture layer refuses


def eagle3_for(model, kind: str, seed: int = 0, vocab=None) -> Eagle3Drafter:
    """``repeat``: fc passes the last layer's feature (after the final norm: what the base's head
    reads) through, attention and MLP add nothing, and the head is the base's: the first draft is
    the token the base chose last, again (the teeth of the comparisons); ``random``: random weights."""
    torch.manual_seed(seed)
    layers = model.config.get_text_config().num_hidden_layers
    ids = (0, 0, layers - 1) if kind == "repeat" else default_layer_ids(model)
    drafter = Eagle3Drafter(model, eagle3_config(model, None if vocab is None else len(vocab)), ids, vocab=vocab)
    if kind == "repeat":
        hidden = drafter.config.hidden_size
        head = model.get_output_embeddings().weight
        with torch.no_grad():
            drafter.fc.weight.zero_()
            drafter.fc.weight[:, 2 * hidden:] = torch.eye(hidden)
            drafter.midlayer.self_attn.o_proj.weight.zero_()
            drafter.midlayer.mlp.down_proj.weight.zero_()
            drafter.lm_head.weight.copy_(head if vocab is None else head[torch.as_tensor(vocab)])
    return drafter


@pytest.mark.parametrize("family", FAMILIES)
def test_eagle3_trees_equal_greedy_on_the_tiny_families(family):
    model = tiny_family_model(family, seed=3)
    assert_trees_equal_greedy(model, {kind: eagle3_for(model, kind) for kind in ("repeat", "random")})


def test_eagle3_in_a_batch_and_across_turns_equals_greedy():
    model = tiny_random_model("llama", seed=2)
    lm = CausalLM(model, drafters={"eagle": eagle3_for(model, "repeat", vocab=list(range(0, 128, 2)))})
    limits = DecodeLimits(max_new_tokens=NEW)
    prompts = [prompt_for(128, s, length) for s, length in ((0, 9), (1, 30), (2, 17))]
    for prompt, out in zip(prompts, decode_batch(lm, prompts, CONFIGS[1], limits)):
        assert out.tokens == decode(lm, prompt, CONFIGS[1], limits).tokens == decode(model, prompt, None, limits).tokens
    first = decode(lm, prompts[1], CONFIGS[1], limits)
    turn2 = prompts[1] + first.tokens + [3, 1, 4, 1, 5]
    second = decode(lm, turn2, CONFIGS[1], limits, state=first.state)
    assert second.stats.prefill_tokens == 6 and second.tokens == decode(model, turn2, None, limits).tokens


def test_the_step_hands_the_last_layer_and_the_fused_layers_side_by_side():
    """With an EAGLE-3 drafter on the model, a features source gets, per committed row, the last
    hidden state then those after the drafter's layers (as one forward over the text gives them),
    and a hidden-state source (Medusa's) still gets the last layer's alone."""
    register_source("fspyx", label="fspyx", features=True)(OutcomeSpy)
    try:
        OutcomeSpy.seen = []
        model = tiny_family_model("qwen2", seed=5, num_hidden_layers=5)
        drafter = Eagle3Drafter(model, eagle3_config(model), (0, 2, 4))
        lm = CausalLM(model, drafters={"eagle": drafter})
        assert lm.feature_layers == (-1, *drafter.aux_layers) == (-1, 1, 3, 5)
        prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 7, 8, 3, 4]
        config = dataclasses.replace(EAGLE, sources={"eagle": 6, "suffix": 3, "fspyx": 1})
        out = decode(lm, prompt, config, DecodeLimits(max_new_tokens=30))
        with torch.inference_mode():
            states = model(torch.tensor([prompt + out.tokens]), output_hidden_states=True).hidden_states
        stream = residual_stream(model, prompt + out.tokens)          # layer 4's output (id 5 = L): before the norm
        full = torch.cat([states[-1][0], stream[1], stream[3], stream[5]], -1)
        for context, hidden, features in OutcomeSpy.seen:
            first = len(context) - 1 - len(features)
            torch.testing.assert_close(features, full[first:len(context) - 1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(hidden, states[-1][0][len(context) - 2], atol=1e-5, rtol=1e-5)
        assert len(OutcomeSpy.seen) > 3
    finally:
        unregister_source("fspyx")


def residual_stream(model, tokens: list[int]) -> list[torch.Tensor]:
    """The states EAGLE-3 fuses, by the published definition (EAGLE's own code, SpecForge, vLLM
    speculators: ``eagle_aux_hidden_state_layer_ids`` index them): state i is the residual stream
    entering decoder layer i (0: the embeddings as the model feeds them), state L the stream leaving
    the last layer; none is after the final norm. Read from the layers' own inputs and output."""
    layers = model.model.layers
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]),
                                             with_kwargs=True) for layer in layers]
    hooks.append(layers[-1].register_forward_hook(lambda m, args, out: seen.append(out[0] if isinstance(out, tuple) else out)))
    try:
        with torch.inference_mode():
            model(torch.tensor([tokens]))
    finally:
        for hook in hooks:
            hook.remove()
    return [state[0] for state in seen]


def test_a_speculators_layer_id_at_the_layer_count_reads_the_state_before_the_final_norm(tmp_path):
    """Issue 62: a speculators checkpoint fusing hidden state L (the layer count) read transformers'
    ``hidden_states[L]``, which is after the final norm. The step now hands the drafter the
    published definition's states (:func:`residual_stream`), and the tree stays lossless."""
    register_source("fspyx", label="fspyx", features=True)(OutcomeSpy)
    try:
        OutcomeSpy.seen = []
        model = tiny_random_model("llama", seed=8, num_hidden_layers=6)
        layers = model.config.num_hidden_layers
        original = Eagle3Drafter(model, eagle3_config(model, 40), (0, 2, layers - 1), vocab=list(range(3, 123, 3)))
        write_layout(tmp_path / "spec", model, original, "speculators")
        config = json.loads((tmp_path / "spec" / "config.json").read_text())
        assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, layers]
        drafter = load_drafter(tmp_path / "spec", model)
        lm = CausalLM(model, drafters={"eagle": drafter})
        assert drafter.aux_layers == (1, 3, layers) and lm.feature_layers == (-1, 1, 3, layers)
        prompt = prompt_for(128, 9)
        run = dataclasses.replace(EAGLE, sources={"eagle": 6, "fspyx": 1})
        out = decode(lm, prompt, run, DecodeLimits(max_new_tokens=NEW))
        assert out.tokens == decode(model, prompt, None, DecodeLimits(max_new_tokens=NEW)).tokens
        text = prompt + out.tokens
        stream = residual_stream(model, text)
        with torch.inference_mode():
            after_norm = model(torch.tensor([text]), output_hidden_states=True).hidden_states
        assert not torch.allclose(after_norm[layers][0], stream[layers], atol=1e-2)   # what was read before
        reference = torch.cat([after_norm[-1][0], stream[1], stream[3], stream[layers]], -1)
        for context, _, features in OutcomeSpy.seen:
            first = len(context) - 1 - len(features)
            torch.testing.assert_close(features, reference[first:len(context) - 1], atol=1e-5, rtol=1e-5)
            with torch.inference_mode():          # the published fusion: fc over the three states side by side
                fused = original.fc(reference[first:len(context) - 1, model.config.hidden_size:])
                torch.testing.assert_close(drafter.from_base(features), fused, atol=1e-5, rtol=1e-5)
        assert len(OutcomeSpy.seen) > 3
    finally:
        unregister_source("fspyx")


def test_eagle3_sampling_keeps_the_distribution():
    from test_sampling import DRAWS, VOCAB, chi_square_pvalue, draw, exact_distribution

    model = tiny_random_model("llama", seed=0, vocab_size=VOCAB, initializer_range=0.05)
    lm = CausalLM(model, drafters={"eagle": eagle3_for(model, "repeat")})
    sampling = SamplingConfig(temperature=1.0)
    counts, multi = draw(lm, EAGLE, sampling)
    assert multi > DRAWS // 10, "the drafter's tree was rarely accepted: the verifier was hardly exercised"
    assert chi_square_pvalue(counts, exact_distribution(model, sampling), DRAWS) > 1e-3


def test_the_fused_feature_and_the_drafters_own_output_take_their_routes():
    """fc reads only the fused layers' columns (the last layer's are not its input); the next draft
    step reads the layer's output before ``norm``; the head scores the draft vocabulary only."""
    model = tiny_random_model("llama", seed=1)
    vocab = list(range(5, 128, 4))
    drafter = eagle3_for(model, "random", vocab=vocab)
    hidden = model.config.hidden_size
    features = torch.randn(3, 4 * hidden)
    changed = features.clone()
    changed[:, :hidden] = 7.0
    torch.testing.assert_close(drafter.from_base(features), drafter.from_base(changed))
    source = EagleSource(drafter, size=10, depth=3)
    text = prompt_for(128, 4, 16)
    with torch.inference_mode():
        states = model(torch.tensor([text]), output_hidden_states=True).hidden_states
    source.update(StepOutcome(text, len(text), text[-1],
                              features=torch.cat([states[i][0] for i in (-1, *drafter.aux_layers)], -1)[:-1]))
    assert {t for d in source.propose(text) for t in d.tokens} <= set(vocab)
    assert drafter.log_probs(source.root[None]).shape == (1, len(vocab))


def test_a_level_priced_above_what_it_can_add_is_not_grown():
    """``draft_cost`` (a level's price in greedy steps): the tree stops growing once the acceptance
    mass its frontier could pass on is below it; at 0 every level grows. Decoding stays greedy's."""
    model = tiny_random_model("llama", seed=1)
    drafter = eagle3_for(model, "random")
    text = prompt_for(128, 4, 16)
    with torch.inference_mode():
        states = model(torch.tensor([text]), output_hidden_states=True).hidden_states
    features = torch.cat([states[i][0] for i in (-1, *drafter.aux_layers)], -1)[:-1]

    def deepest(cost: float) -> tuple[int, float]:
        source = EagleSource(drafter, size=40, depth=5, level_cost=cost)
        source.update(StepOutcome(text, len(text), text[-1], features=features))
        nodes = source._nodes(source._grow_on_device().tolist())     # every node the levels generated
        return max(n.depth for n in nodes), sum(math.exp(n.score) for n in nodes if n.depth == 1)

    full, mass = deepest(0.0)
    assert full == 5 and deepest(1.0)[0] == 1                 # a level never adds more than one token
    assert 0.01 < mass < 0.99                                 # the first level's mass: what level 2 can add
    assert deepest(mass + 0.005)[0] == 1 and deepest(mass - 0.005)[0] >= 2
    config = dataclasses.replace(EAGLE, draft_cost=0.3)
    lm = CausalLM(model, drafters={"eagle": eagle3_for(model, "repeat")})
    prompt = prompt_for(128, 3)
    out = decode(lm, prompt, config, DecodeLimits(max_new_tokens=NEW))
    assert out.tokens == decode(model, prompt, None, DecodeLimits(max_new_tokens=NEW)).tokens
    assert "_dc" in config_label(config)


# ---------------------------------------------------------------------------------------------
# The published layouts, written by hand


def _llama_fields(drafter: Eagle3Drafter) -> dict:
    c = drafter.config
    return {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_parameters["rope_theta"],
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
            "draft_vocab_size": drafter.lm_head.out_features, "tie_word_embeddings": False}


def write_layout(folder, model, drafter: Eagle3Drafter, layout: str, **config_changes) -> None:
    """``drafter`` as each project publishes it: ``official`` (EAGLE's: a LlamaForCausalLM config, no
    layer ids, ``midlayer.*``, ``pytorch_model.bin``), ``specforge`` (``LlamaForCausalLMEagle3``, the
    layer ids in ``eagle_config``), ``speculators`` (``Eagle3Speculator``: the layer's config nested,
    the ids counted as hidden-state indices, ``layers.0.*``, the base's embeddings saved)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in drafter.state_dict().items()}
    if drafter.vocab is not None:
        state["d2t"] = drafter.vocab - torch.arange(len(drafter.vocab))
        state["t2d"] = torch.zeros(model.config.vocab_size, dtype=torch.bool)
        state["t2d"][drafter.vocab] = True
    if layout == "official":
        config = {"architectures": ["LlamaForCausalLM"], **_llama_fields(drafter)}
    elif layout == "specforge":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **_llama_fields(drafter),
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(drafter.layer_ids)}}
    else:
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "transformer_layer_config": _llama_fields(drafter),
                  "draft_vocab_size": drafter.lm_head.out_features, "norm_before_residual": False,
                  "target_hidden_size": drafter.config.hidden_size,
                  "eagle_aux_hidden_state_layer_ids": [i + 1 for i in drafter.layer_ids],
                  "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "tiny"}}}
        state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}
        state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    config.update(config_changes)
    (folder / "config.json").write_text(json.dumps(config))
    if layout == "official":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))


@pytest.mark.parametrize("layout", ["official", "specforge", "speculators"])
def test_each_published_eagle3_layout_loads_and_drafts_as_its_weights_say(tmp_path, layout):
    model = tiny_random_model("llama", seed=8, num_hidden_layers=6)
    ids = (1, 2, 2) if layout == "official" else (0, 3, 5)          # the official layout names none: the default
    assert default_layer_ids(model) == (1, 2, 2)
    original = Eagle3Drafter(model, eagle3_config(model, 40), ids, vocab=list(range(3, 123, 3)))
    write_layout(tmp_path / layout, model, original, layout)
    loaded = load_drafter(tmp_path / layout, model)
    assert isinstance(loaded, Eagle3Drafter) and loaded.layer_ids == ids and loaded.vocab.tolist() == original.vocab.tolist()
    for key, value in original.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value)
    prompt = prompt_for(128, 9)
    runs = [decode(CausalLM(model, drafters={"eagle": d}), prompt, CONFIGS[1], DecodeLimits(max_new_tokens=NEW))
            for d in (original, loaded)]
    assert runs[0].tokens == runs[1].tokens == decode(model, prompt, None, DecodeLimits(max_new_tokens=NEW)).tokens
    assert runs[0].stats.accepted == runs[1].stats.accepted


def test_an_eagle3_drafter_saved_here_loads_again_and_decodes_the_same_tokens(tmp_path):
    model = tiny_random_model("llama", seed=8)
    drafter = eagle3_for(model, "repeat", vocab=list(range(0, 128, 2)))
    save_drafter(drafter, tmp_path / "mine", training={"steps": 3})
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 64
    loaded = load_drafter(tmp_path / "mine", model)
    assert loaded.training_record == {"steps": 3} and loaded.layer_ids == drafter.layer_ids
    prompt = prompt_for(128, 2)
    runs = [decode(CausalLM(model, drafters={"eagle": d}), prompt, EAGLE, DecodeLimits(max_new_tokens=NEW))
            for d in (drafter, loaded)]
    assert runs[0].tokens == runs[1].tokens and runs[0].stats.accepted == runs[1].stats.accepted
    assert sum(runs[0].stats.accepted) > len(runs[0].stats.accepted)        # drafts were accepted: teeth


@pytest.mark.parametrize("layout,change,why", [
    ("specforge", {"hidden_size": 32}, "hidden_size=32"),
    ("official", {"vocab_size": 1000}, "vocab_size=1000"),
    ("speculators", {"target_hidden_size": 128}, "target_hidden_size=128"),
    ("specforge", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}}, r"layers 0\.\.5"),
    ("specforge", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}, "fuses 192 feature columns"),
    ("specforge", {"draft_vocab_size": 50}, "draft_vocab_size 50 but d2t has 40"),
    ("speculators", {"transformer_layer_config": {"model_type": "qwen3"}}, "qwen3 layer"),
    ("speculators", {"fc_norm": True}, "fc_norm"),
], ids=["hidden", "vocab", "target-hidden", "layer-id", "fc-width", "draft-vocab", "layer-type", "variant"])
def test_an_eagle3_checkpoint_for_another_base_is_refused(tmp_path, layout, change, why):
    model = tiny_random_model("llama", seed=8, num_hidden_layers=6)
    drafter = Eagle3Drafter(model, eagle3_config(model, 40), (0, 3, 5), vocab=list(range(3, 123, 3)))
    write_layout(tmp_path / layout, model, drafter, layout, **change)
    with pytest.raises(ValueError, match=why):
        load_drafter(tmp_path / layout, model)


def test_eagle3_weights_that_do_not_fit_are_refused(tmp_path):
    model = tiny_random_model("llama", seed=8, num_hidden_layers=6)
    other = tiny_random_model("llama", seed=9, num_hidden_layers=6)
    write_layout(tmp_path / "embed", other, Eagle3Drafter(other, eagle3_config(other), (0, 3, 5)), "speculators")
    with pytest.raises(ValueError, match="embed_tokens.weight that is not the base's own"):
        load_drafter(tmp_path / "embed", model)
    drafter = Eagle3Drafter(model, eagle3_config(model, 40), (0, 3, 5), vocab=list(range(3, 123, 3)))
    write_layout(tmp_path / "maps", model, drafter, "specforge")
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "maps" / "model.safetensors"))
    state["t2d"][0] = True                                              # a token d2t does not map
    save_file(state, str(tmp_path / "maps" / "model.safetensors"))
    with pytest.raises(ValueError, match="d2t and t2d maps that disagree"):
        load_drafter(tmp_path / "maps", model)
    state = load_file(str(tmp_path / "maps" / "model.safetensors"))
    del state["midlayer.hidden_norm.weight"], state["t2d"]
    save_file(state, str(tmp_path / "maps" / "model.safetensors"))
    with pytest.raises(ValueError, match="missing .*hidden_norm"):
        load_drafter(tmp_path / "maps", model)


# ---------------------------------------------------------------------------------------------
# Training here: python -m experiments.tools.eagle version=3


def test_the_training_time_test_unrolls_drafting_exactly_as_the_tree_runs_it():
    """``rollout``'s step k at start t equals the drafter run incrementally as the source runs it:
    the text up to t fed with the base's features, then the chain t + 2, t + 3, ... fed with its own
    outputs, each at its position, seeing the text and its ancestors only."""
    from transformers import DynamicCache

    from experiments.tools.eagle import rollout
    from lookahead_core.eagle import causal

    model = tiny_random_model("llama", seed=3, num_hidden_layers=4)
    drafter = eagle3_for(model, "random", seed=4)
    text = torch.tensor([prompt_for(128, 6, 20)])
    with torch.inference_mode():
        states = model(text, output_hidden_states=True).hidden_states
        features = torch.cat([states[i] for i in (-1, *drafter.aux_layers)], -1)
        unrolled = list(rollout(drafter, text, features, 4))
        for t in (0, 7, 14):
            cache = DynamicCache()
            out = drafter(text[0, 1:t + 2], drafter.from_base(features[0, :t + 1]), *(x[0] for x in causal(t + 1, "cpu")),
                          cache)[-1:]
            for k in range(4):
                torch.testing.assert_close(out[0], unrolled[k][0, t], atol=1e-5, rtol=1e-5)
                if t + 2 + k >= text.shape[1]:
                    break
                past = cache.get_seq_length()
                out = drafter(text[0, t + 2 + k:t + 3 + k], out, torch.tensor([t + 1 + k]),
                              torch.ones(1, past + 1, dtype=torch.bool), cache)


def test_eagle3_training_saves_a_drafter_in_the_published_layout_and_resumes(tmp_path, capsys, monkeypatch):
    import sys

    from experiments.tools import eagle as tool
    from test_medusa import resumes_from_step_6_to_9

    out = tmp_path / "eagle3"
    args = ["eagle", "model=tiny_llama", f"out={out}", "tokens=6000", "batch=2", "eval_every=3", "depth=3",
            "draft_vocab=40", "ttt=3", "version=3"]
    monkeypatch.setattr(sys, "argv", args + ["steps=6"])
    tool.main()
    config = json.loads((out / "config.json").read_text())
    record = config["training"]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 40
    assert record["version"] == 3 and record["ttt"] == 3 and len(record["acceptance"]) == 3
    assert record["acceptance"] == sorted(record["acceptance"], reverse=True)
    header = (out / "curve.csv").read_text().splitlines()[0]
    assert "token_loss" in header and "feature_loss" not in header        # EAGLE-3 has no feature loss
    answers = record["answers"]                # half the text: the base's own greedy answers
    assert answers["recipe"] == "self-answers-v2" and answers["tokens"] >= 2560 and answers["asked"] > 0
    stored = next(out.glob("work/answers_*/answers.json"))
    written = stored.stat().st_mtime_ns
    resumes_from_step_6_to_9(tool.main, args, out, capsys, monkeypatch)
    assert stored.stat().st_mtime_ns == written                          # generated once
    model = tiny_random_model("llama")
    loaded = load_drafter(out, model)
    assert isinstance(loaded, Eagle3Drafter) and len(loaded.vocab) == 40
    assert loaded.layer_ids == tuple(record["layer_ids"]) == default_layer_ids(model)
    prompt = prompt_for(128, 9)
    lm = CausalLM(model, drafters={"eagle": loaded})
    assert decode(lm, prompt, EAGLE, DecodeLimits(max_new_tokens=20)).tokens == \
        decode(model, prompt, None, DecodeLimits(max_new_tokens=20)).tokens


def test_the_requests_the_base_answers_are_everyday_ones_and_the_standard_librarys_docstrings():
    from experiments.tools.distill import ASK, TOPIC_ASK, docstrings, instructions, stdlib_files, topics

    class Words:                      # a tokenizer whose tokens are a few words and fragments
        vocab = [" garden", " Paris", " apple", "ing", " rivers", " x1234", " boat"]
        vocab_size = len(vocab)

        def decode(self, ids):
            return "".join(self.vocab[i] for i in ids)

    assert sorted(topics(Words(), 0)) == ["apple", "garden", "rivers"]      # lower-case words of 5-12 letters
    mixed = instructions(0, Words())
    assert len(mixed) == 6 and mixed[1::2] == instructions(0)[:3]
    assert all(any(a == t.format(topic=w) for t in TOPIC_ASK for w in ("apple", "garden", "rivers")) for a in mixed[::2])
    asks = instructions(0)
    assert len(asks) > 500
    assert asks[0].startswith(ASK[0].split("{")[0]) and asks[1].startswith(ASK[1].split("{")[0])
    first = asks[0].split("\n\n", 1)[1]
    assert any(first in doc for path in stdlib_files(0)[:40] for doc in docstrings(path.read_text(encoding="utf-8")))


def test_suite_eagle_runs_every_drafter_and_the_report_tabulates_them(tmp_path, monkeypatch):
    """``suite=eagle`` on the tiny model with a drafter and heads in the cache: every decoder decodes
    greedy's tokens; the report names each by its role, gives the drafter's share of the decode
    time where there is one, the EAGLE nodes' acceptance per depth and a labelled projection."""
    from hydra import compose, initialize_config_dir

    from conftest import DATA_ROOT
    from experiments.config.schema import register_configs
    from experiments.data.datasets import repo_root
    from experiments.job import runner
    from experiments.models.heads import heads_dir
    from experiments.reporting.drafters import collect
    from lookahead_core.medusa import save_heads
    from test_medusa import for_model

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    model = tiny_random_model("llama")
    save_drafter(eagle3_for(model, "repeat"), heads_dir("tiny_llama", kind="eagle"), training={"acceptance": [0.9]})
    save_heads(for_model(model, 4), heads_dir("tiny_llama"))
    threads = torch.get_num_threads()
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["suite=eagle", "model=tiny_llama", "experiment=mtbench", "dataset.limit=2",
                                               f"data_root={DATA_ROOT}", "experiment.max_new_tokens=16", "threads=1",
                                               "warmup=0", f"results_dir={tmp_path / 'runs' / 'a'}"])
        runner.run(cfg)
    finally:
        torch.set_num_threads(threads)
    text = collect(tmp_path / "runs")
    speed = text.split("\n\n## ")[0]
    rows = {line.split(" | ")[2]: line for line in speed.splitlines() if line.startswith("| tiny_llama")}
    assert set(rows) == {"generate greedy", "prompt lookup k=3", "EAGLE alone", "EAGLE + training-free tree",
                         "Medusa heads alone", "training-free tree", "auto (default)", "auto, training-free"}
    assert all(line.endswith("| 100% |") for line in rows.values()), speed        # every output equalled greedy
    share = {role: line.split(" | ")[7] for role, line in rows.items()}
    assert share["EAGLE alone"].endswith("%") and share["Medusa heads alone"].endswith("%")
    assert share["training-free tree"] == "" and share["auto, training-free"] == ""
    assert "| depth 1 |" in text.split("## EAGLE nodes")[1].splitlines()[2]
    assert "## A projection, not a measurement" in text
    costs = text.split("## Where a step's time goes")[1].split("\n\n## ")[0]
    costs = {line.split(" | ")[2]: line.split(" | ") for line in costs.splitlines() if line.startswith("| tiny_llama")}
    for decoder in ("EAGLE alone", "Medusa heads alone", "training-free tree"):   # the parts add up to the speedup
        forward, drafter, rest, step, ratio = (float(x.strip(" |x\n")) for x in costs[decoder][4:9])
        assert step == pytest.approx(forward + drafter + rest, abs=0.015) and forward > 0 and rest > 0
        assert ratio == pytest.approx(float(rows[decoder].split(" | ")[8].rstrip("x")), abs=0.011)
    assert float(costs["EAGLE alone"][5]) > 0 and float(costs["training-free tree"][5]) == 0
