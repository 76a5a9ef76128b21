"""Medusa heads as a draft source: lossless in fp32 on the tiny families, the hidden state each step
drafts from is the right one, checkpoints in FasterDecoding's format load (or are refused with a
reason), and the training command trains, saves and resumes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

import pytest
import torch

from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, SamplingConfig, decode, decode_batch
from lookahead_core.medusa import MedusaHeads, MedusaSource, for_model, load_heads, medusa_tree, save_heads
from lookahead_core.sources import SOURCES, register_source, unregister_source
from experiments.models.tiny import tiny_random_model
from tiny_families import tiny_family_model

FAMILIES = ["llama", "mistral", "qwen2", "gemma2", "gpt2", "gpt_neox", "phi3", "opt", "cohere", "falcon_rotary"]
NEW = 40
MEDUSA = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=4, sources={"medusa": 12})
CONFIGS = [
    MEDUSA,                                                                  # heads alone (decoding=medusa)
    LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True, tree=True, depth=4,
                    budget=10, sources={"medusa": 8, "suffix": 4, "recycle": 4}),   # mixed with every source, a budget
    LookaheadConfig(window=4, ngram=4, guess=4, tree=True, depth=3, sources={"medusa": 6}),   # beside a window
]


def heads_for(model, seed: int, noise: float) -> MedusaHeads:
    """Heads sharing the base's LM head; block weights ``noise``-scaled random (0: identity blocks,
    so head k proposes the base's own next token again: accepted wherever the output repeats)."""
    heads = for_model(model, 4, 1)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * noise)
    return heads


def prompt_for(vocab: int, seed: int = 0, length: int = 24) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (length,), generator=gen).tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_medusa_trees_equal_greedy_on_the_tiny_families(family):
    model = tiny_family_model(family, seed=3)
    reference_lm = CausalLM(model)
    accepted = 0
    for seed, noise in ((0, 0.0), (1, 0.05), (2, 1.0)):
        lm = CausalLM(model, drafters={"medusa": heads_for(model, seed, noise)})
        for p, config in enumerate(CONFIGS):
            prompt = prompt_for(model.config.vocab_size, seed * 10 + p)
            reference = decode(reference_lm, prompt, None, DecodeLimits(max_new_tokens=NEW)).tokens
            out = decode(lm, prompt, config, DecodeLimits(max_new_tokens=NEW))
            assert out.tokens == reference, (family, seed, config)
            table = {(r["source"], r["depth"]): r for r in out.stats.drafts.counts.table()}
            assert table[("medusa", 1)]["fed"] > 0, "the heads proposed nothing"
            assert 0 < out.stats.draft_seconds < out.stats.decode_seconds      # the heads' time, counted apart
            accepted += sum(r["accepted"] for (s, _), r in table.items() if s == "medusa")
    assert accepted > 0, "no Medusa draft was ever accepted: the comparison had no teeth"


def test_decode_batch_with_medusa_equals_each_sequence_alone():
    model = tiny_random_model("llama", seed=2)
    lm = CausalLM(model, drafters={"medusa": heads_for(model, 0, 0.0)})
    prompts = [prompt_for(128, s, length) for s, length in ((0, 9), (1, 30), (2, 17))]
    limits = DecodeLimits(max_new_tokens=NEW)
    batch = decode_batch(lm, prompts, CONFIGS[1], limits)
    for prompt, out in zip(prompts, batch):
        alone = decode(lm, prompt, CONFIGS[1], limits)
        assert out.tokens == alone.tokens == decode(model, prompt, None, limits).tokens
        assert out.stats.accepted == alone.stats.accepted


class OutcomeSpy:
    """A source that records what each update hands it (context, hidden state, features), registered
    with hidden=True or features=True by the test that uses it."""

    topk = 0
    seen: list[tuple[list[int], torch.Tensor | None, torch.Tensor | None]] = []

    @classmethod
    def from_config(cls, config, size, context):
        return cls()

    def propose(self, context: Sequence[int]):
        return []

    def update(self, outcome) -> None:
        copy = lambda t: None if t is None else t.clone()    # noqa: E731
        OutcomeSpy.seen.append((list(outcome.context), copy(outcome.hidden), copy(outcome.features)))


@pytest.mark.parametrize("config", [dict(window=1, ngram=3, guess=3, pool_only=True, tree=True, sources={"suffix": 3}),
                                    dict(window=4, ngram=4, guess=4, prompt_pool=True, tree=True, sources={})],
                         ids=["pool-suffix", "window"])
def test_each_step_drafts_from_the_hidden_state_that_predicted_its_last_token(config):
    """The hidden state handed over after a step is the model's last hidden state at the token before
    the last committed one (the row whose logits chose it), as a fresh forward over the text gives it."""
    register_source("spy", label="spy", hidden=True)(OutcomeSpy)
    try:
        OutcomeSpy.seen = []
        model = tiny_random_model("llama", seed=5)
        prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 6, 7, 8, 3, 4]
        out = decode(model, prompt, LookaheadConfig(**{**config, "sources": {**config["sources"], "spy": 1}}), DecodeLimits(max_new_tokens=30))
        assert max(out.stats.accepted) > 1, "no multi-token step: the row choice was not exercised"
        assert len(OutcomeSpy.seen) == out.stats.steps + 1           # the prefill's, then one per step
        with torch.inference_mode():
            full = model(torch.tensor([prompt + out.tokens]), output_hidden_states=True).hidden_states[-1][0]
        for context, hidden, _ in OutcomeSpy.seen:
            torch.testing.assert_close(hidden, full[len(context) - 2], atol=1e-5, rtol=1e-5)
    finally:
        unregister_source("spy")


def test_a_medusa_config_without_heads_is_refused():
    model = tiny_random_model("llama", seed=0)
    with pytest.raises(ValueError, match=r"drafters=\{'medusa'"):
        decode(model, [1, 2, 3], MEDUSA, DecodeLimits(max_new_tokens=4))


def test_medusa_sampling_keeps_the_distribution():
    """Recursive rejection over the heads' tree: the first 3 tokens' distribution is the model's."""
    from test_sampling import DRAWS, VOCAB, chi_square_pvalue, draw, exact_distribution

    model = tiny_random_model("llama", seed=0, vocab_size=VOCAB, initializer_range=0.05)
    lm = CausalLM(model, drafters={"medusa": heads_for(model, 1, 0.3)})
    sampling = SamplingConfig(temperature=1.0)
    probs = exact_distribution(model, sampling)
    counts, multi = draw(lm, MEDUSA, sampling)
    assert multi > DRAWS // 10, "the heads' drafts were rarely accepted: the verifier was hardly exercised"
    assert chi_square_pvalue(counts, probs, DRAWS) > 1e-3


def test_medusa_tree_is_prefix_closed_best_first():
    accuracy = [[0.7, 0.2, 0.05], [0.5, 0.3, 0.1], [0.4, 0.1, 0.1]]
    tree = medusa_tree(accuracy, 8)
    assert len(tree) == 8 and len(set(tree)) == 8
    assert all(p[:-1] in tree[:i] for i, p in enumerate(tree) if len(p) > 1)       # parents first

    def score(path):
        out = 1.0
        for depth, rank in enumerate(path):
            out *= accuracy[depth][rank]
        return out

    scores = [score(p) for p in tree]
    assert scores == sorted(scores, reverse=True)
    # By hand: 0.7, 0.35 (0,0), 0.21 (0,1), 0.2 (1), 0.14 (0,0,0), 0.1 (1,0), 0.084 (0,1,0), 0.07 (0,2)
    assert tree == [(0,), (0, 0), (0, 1), (1,), (0, 0, 0), (1, 0), (0, 1, 0), (0, 2)]
    assert medusa_tree(accuracy, 100)[-1] in {(2, 2, 1), (2, 2, 2)} and len(medusa_tree(accuracy, 100)) == 39


def test_the_source_proposes_the_heads_top_tokens_along_the_tree():
    model = tiny_random_model("llama", seed=0)
    heads = heads_for(model, 4, 1.0)
    source = MedusaSource(heads, 6, depth=3)
    hidden = torch.randn(model.config.hidden_size)
    from lookahead_core.drafts import StepOutcome

    source.update(StepOutcome([1, 2], 2, 2, hidden=hidden))
    top = heads(hidden[None])[:, 0].topk(5, dim=-1).indices
    drafts = source.propose([1, 2])
    assert drafts and all(len(d.tokens) <= 3 for d in drafts)
    for draft in drafts:
        ranks = [int(tag.split(":")[1]) for tag in draft.tags]
        assert list(draft.tokens) == [int(top[d, r]) for d, r in enumerate(ranks)]
        assert tuple(ranks) in source.paths


# ---------------------------------------------------------------------------------------------
# Checkpoints


def write_fasterdecoding(folder, hidden: int, vocab: int, heads: int, layers: int, *, own_lm_head: bool,
                         base: str = "tiny/llama", weights: str = "medusa_lm_head.pt", seed: int = 0) -> dict:
    """A checkpoint as FasterDecoding's code writes one: torch.save of the head ModuleList's state
    dict (keys ``{k}.{j}.linear.weight/bias`` and, with own LM heads, ``{k}.{layers}.weight``) and a
    config.json with medusa_num_heads / medusa_num_layers / base_model_name_or_path; written by hand."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for k in range(heads):
        for j in range(layers):
            state[f"{k}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=gen) * 0.1
            state[f"{k}.{j}.linear.bias"] = torch.randn(hidden, generator=gen) * 0.1
        if own_lm_head:
            state[f"{k}.{layers}.weight"] = torch.randn(vocab, hidden, generator=gen)
    folder.mkdir(parents=True, exist_ok=True)
    if weights.endswith(".pt"):
        torch.save(state, folder / weights)
    else:
        from safetensors.torch import save_file
        save_file(state, str(folder / weights))
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                    "base_model_name_or_path": base}))
    return state


def by_hand(state: dict, hidden: torch.Tensor, k: int, layers: int, lm_head: torch.Tensor) -> torch.Tensor:
    x = hidden
    for j in range(layers):
        x = x + torch.nn.functional.silu(x @ state[f"{k}.{j}.linear.weight"].T + state[f"{k}.{j}.linear.bias"])
    return x @ state.get(f"{k}.{layers}.weight", lm_head).T


@pytest.mark.parametrize("own_lm_head,weights,layers", [(True, "medusa_lm_head.pt", 1),
                                                         (False, "medusa_lm_head.pt", 2),
                                                         (True, "medusa_lm_head.safetensors", 1)],
                         ids=["own-lm-heads-pt", "shared-lm-head-2-layers", "safetensors"])
def test_a_fasterdecoding_checkpoint_loads_and_computes_what_its_weights_say(tmp_path, own_lm_head, weights, layers):
    model = tiny_random_model("llama", seed=0)
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    state = write_fasterdecoding(tmp_path / "ckpt", hidden, vocab, 3, layers, own_lm_head=own_lm_head, weights=weights)
    heads = load_heads(tmp_path / "ckpt", model)
    assert heads.num_heads == 3 and heads.shares_lm_head == (not own_lm_head)
    x = torch.randn(5, hidden)
    with torch.no_grad():
        got = heads(x)
    lm_head = model.get_output_embeddings().weight.detach()
    for k in range(3):
        torch.testing.assert_close(got[k], by_hand(state, x, k, layers, lm_head), atol=1e-4, rtol=1e-4)
    # and it decodes losslessly
    lm = CausalLM(model, drafters={"medusa": heads})
    prompt = prompt_for(vocab, 3)
    assert decode(lm, prompt, MEDUSA, DecodeLimits(max_new_tokens=20)).tokens == \
        decode(model, prompt, None, DecodeLimits(max_new_tokens=20)).tokens


def test_heads_that_do_not_fit_the_base_are_refused(tmp_path):
    model = tiny_random_model("llama", seed=0)
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    write_fasterdecoding(tmp_path / "wide", hidden * 2, vocab, 2, 1, own_lm_head=True, base="other/model")
    with pytest.raises(ValueError, match=r"linear.weight is \(128, 128\).*hidden size is 64"):
        load_heads(tmp_path / "wide", model)
    write_fasterdecoding(tmp_path / "vocab", hidden, vocab + 7, 2, 1, own_lm_head=True, base="other/model")
    with pytest.raises(ValueError, match=r"LM head is \(128, 64\).*heads for other/model"):
        load_heads(tmp_path / "vocab", model)
    write_fasterdecoding(tmp_path / "declared", hidden, vocab, 2, 1, own_lm_head=False)
    config = json.loads((tmp_path / "declared" / "config.json").read_text())
    (tmp_path / "declared" / "config.json").write_text(json.dumps({**config, "vocab_size": 32000}))
    with pytest.raises(ValueError, match="vocab_size 32000, the base model has 128"):
        load_heads(tmp_path / "declared", model)
    write_fasterdecoding(tmp_path / "renamed", hidden, vocab, 2, 1, own_lm_head=False)
    state = torch.load(tmp_path / "renamed" / "medusa_lm_head.pt")
    torch.save({k.replace("linear", "proj"): v for k, v in state.items()}, tmp_path / "renamed" / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="do not match 2 heads of 1 layers"):
        load_heads(tmp_path / "renamed", model)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json is missing"):
        load_heads(tmp_path / "empty", model)
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    with pytest.raises(ValueError, match="no Medusa weights"):
        load_heads(tmp_path / "empty", model)


def test_saved_heads_round_trip_without_the_shared_lm_head(tmp_path):
    model = tiny_random_model("llama", seed=0)
    heads = heads_for(model, 7, 0.5)
    heads.accuracy = [[0.5, 0.2], [0.3, 0.1], [0.2, 0.1], [0.1, 0.05]]
    save_heads(heads, tmp_path / "h")
    saved = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(
        str(tmp_path / "h" / "medusa_lm_head.safetensors")))
    assert saved == {f"{k}.0.linear.{p}" for k in range(4) for p in ("weight", "bias")}   # no LM head copied
    loaded = load_heads(tmp_path / "h", model)
    x = torch.randn(3, model.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), heads(x))
    assert loaded.accuracy == heads.accuracy and loaded.shares_lm_head


def test_medusa_is_a_registered_source_named_in_labels():
    from experiments.config.labels import config_label

    assert SOURCES["medusa"].drafter and SOURCES["medusa"].hidden
    assert config_label(MEDUSA) == "pool_N4G0_tree_md12_d4"


# ---------------------------------------------------------------------------------------------
# Training


def test_training_saves_heads_with_their_curve_and_accuracy_and_resumes(tmp_path, capsys, monkeypatch):
    from experiments.tools import distill
    from experiments.tools import medusa as preset

    out = tmp_path / "heads"
    args = ["medusa", "model=tiny_llama", f"out={out}", "tokens=6000", "batch=64", "eval_every=3", "heads=3"]
    monkeypatch.setattr(sys, "argv", args + ["steps=6"])
    preset.main()
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 3 and config["shared_lm_head"]
    assert len(config["accuracy"]) == 3 and all(len(row) == 10 and sum(row) <= 1 + 1e-6 for row in config["accuracy"])
    record = config["training"]
    assert record["corpus"] == distill.CORPUS and record["steps"] == 6 and record["files"]["code"] > 0
    assert record["files"]["prose"] > 0 and record["tokens"] == (6000 // 2 // distill.CHUNK) * distill.CHUNK * 2
    curve = (out / "curve.csv").read_text().splitlines()
    assert len(curve) == 1 + 6 and "heldout_top1_3" in curve[0] and (out / "curve.png").stat().st_size > 0
    resumes_from_step_6_to_9(preset.main, args, out, capsys, monkeypatch)
    model = tiny_random_model("llama")
    heads = load_heads(out, model)
    lm = CausalLM(model, drafters={"medusa": heads})
    prompt = prompt_for(128, 9)
    assert decode(lm, prompt, MEDUSA, DecodeLimits(max_new_tokens=20)).tokens == \
        decode(model, prompt, None, DecodeLimits(max_new_tokens=20)).tokens


def resumes_from_step_6_to_9(main, args: list[str], out, capsys, monkeypatch) -> None:
    """A training tool that ran 6 steps, run again with ``steps=9``, resumes at step 6, extends its
    curve to 9 rows and computes no feature shard again."""
    shards = {p.name: p.stat().st_mtime_ns for p in (out / "work").rglob("shard_*.pt")}
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", args + ["steps=9"])
    main()
    assert "resuming at step 6 of 9" in capsys.readouterr().out
    assert len((out / "curve.csv").read_text().splitlines()) == 1 + 9
    assert {p.name: p.stat().st_mtime_ns for p in (out / "work").rglob("shard_*.pt")} == shards   # cached once


@pytest.mark.parametrize("override, key", [("token=6000", "token"), ("tokens=-5", "tokens"), ("lr=fast", "lr"),
                                           ("model=nowhere", "model"), ("model.linear=stream", "model.linear")])
def test_a_bad_training_config_is_refused_in_one_line_naming_the_key(override, key):
    refused_in_one_line("experiments.tools.medusa", override, key)


def refused_in_one_line(tool: str, override: str, key: str) -> None:
    """Before torch loads: one line naming ``key``, exit 2."""
    from experiments.data.datasets import repo_root

    done = subprocess.run([sys.executable, "-m", tool, *override.split()], cwd=repo_root(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and key in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_the_corpus_is_the_standard_library_code_then_its_docstrings():
    from experiments.tools.distill import docstrings, stdlib_files

    files = stdlib_files(0)
    assert files == stdlib_files(0) and files != stdlib_files(1)
    assert not any({"test", "tests", "idlelib", "encodings"} & set(p.parts) for p in files)
    docs = docstrings('"""A module docstring that is long enough to be kept by the corpus filter, surely, at 80+ chars."""\n'
                      'def f():\n    """short"""\n')
    assert docs == ["A module docstring that is long enough to be kept by the corpus filter, surely, at 80+ chars."]


def test_a_job_runs_medusa_configs_and_the_report_tabulates_them(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from experiments.config.schema import register_configs
    from experiments.data.datasets import repo_root
    from experiments.job import runner
    from experiments.models.heads import heads_dir
    from experiments.reporting.drafters import collect
    from conftest import DATA_ROOT

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    save_heads(for_model(tiny_random_model("llama"), 4), heads_dir("tiny_llama"))
    core = "use:lookahead,window:1,ngram:4,guess:0,pool_only:true,tree:true,depth:4"
    decoders = f"[hf_pld,greedy,{{{core},name:md7,sources:{{medusa:7}}}},{{use:tree,budget:8}},medusa_tree]"
    threads = torch.get_num_threads()
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["model=tiny_llama", "experiment=mtbench", "dataset.limit=2",
                                               f"data_root={DATA_ROOT}", "experiment.max_new_tokens=16",
                                               f"decoders={decoders}", "baseline=hf_greedy", "threads=1",
                                               "warmup=0", f"results_dir={tmp_path / 'runs' / 'a'}"])
        runner.run(cfg)
    finally:
        torch.set_num_threads(threads)
    text = collect(tmp_path / "runs")
    for role in ("generate greedy", "core greedy", "prompt lookup k=3", "Medusa heads alone", "training-free tree",
                 "Medusa + training-free tree"):
        assert f"| {role} |" in text, role
    assert "head 1" in text and (tmp_path / "runs" / "table.md").read_text() == text
    speed = text.split("## Medusa nodes")[0].splitlines()
    rows = [line for line in speed if line.startswith("| tiny_llama")]
    assert len(rows) == 6 and all(line.endswith("| 100% |") for line in rows)   # every output equalled greedy
