"""``model.generate(..., custom_generate="hub")``: this project's decoder behind transformers' API.

Greedy output equals transformers' greedy ``generate`` token for token in fp32 on tiny models of
the tested families and on SmolLM2, alone and in left-padded batches, for every preset and option;
sampling keeps the model's distribution (the chi-square test of tests/test_sampling.py); a streamer
sees every token once; stopping criteria and stop strings stop where ``generate`` stops; what the
loop cannot serve is refused naming the option; and the folder loads through transformers' own
``custom_generate`` route (``trust_remote_code`` required)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from experiments.data.datasets import repo_root
from experiments.models.loader import load_model
from experiments.models.tiny import tiny_random_model
from lookahead_core import LookaheadConfig
from lookahead_core.cost import CostModel
from lookahead_core.generate import generate as lookahead_generate

from test_sampling import DEPTH, PROMPT, VOCAB, chi_square_pvalue, exact_distribution
from tiny_families import tiny_family_model

HUB = str(repo_root() / "hub")
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "gpt_neox", "granite", "starcoder2")
# A curve on which wide steps cost about what one-token steps do: auto's tree feeds many nodes.
FLAT = CostModel(tokens=(1, 2, 4, 8, 16, 32, 64), seconds=(1.0, 1.0, 1.0, 1.02, 1.05, 1.1, 1.2))
OPTIONS = [
    {"lookahead": "greedy"},
    {"lookahead": "lookahead"},
    {"lookahead": {"window": 3, "ngram": 3, "guess": 3, "prompt_pool": True}},
    {"lookahead": LookaheadConfig(window=2, ngram=3, guess=4, prompt_pool=True, tree=True,
                                  sources={"suffix": 3, "recycle": 2}, budget=12)},
    {"lookahead": "auto", "latency_curve": FLAT},
]
OPTION_IDS = ["greedy", "paper", "pool", "tree", "auto"]


def via_hub(model, *args, **kwargs):
    return model.generate(*args, custom_generate=HUB, trust_remote_code=True, **kwargs)


def prompts(vocab: int, lengths=(20,), seed: int = 0) -> list[list[int]]:
    """Token lists with repeats (so pools and suffix drafts find candidates), ids from 3 up."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randint(3, vocab, (8,), generator=gen).tolist()
    return [(base * 4)[: n - 4] + torch.randint(3, vocab, (4,), generator=gen).tolist() for n in lengths]


def left_padded(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_generate_on_every_family_with_every_option(family):
    model = tiny_family_model(family)
    ids = torch.tensor(prompts(model.config.vocab_size))
    reference = model.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    for options in OPTIONS:
        stats = []
        out = lookahead_generate(model, ids, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0,
                                 lookahead_stats=stats, **options)
        assert torch.equal(out, reference), (family, options)
        assert len(stats) == 1 and stats[0].new_tokens == 32
    assert any(a > 1 for a in stats[0].accepted), "auto's tree never committed more than one token"


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
def test_left_padded_batches_equal_generate_batched(options):
    model = tiny_family_model("llama")
    ids, mask = left_padded(prompts(model.config.vocab_size, lengths=(20, 13, 17), seed=1))
    eos = int(ids[0, -1])                     # a token the model is likely to produce: rows end at different steps
    reference = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=eos,
                               pad_token_id=0)
    out = lookahead_generate(model, ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=eos,
                             pad_token_id=0, **options)
    assert torch.equal(out, reference)


def test_the_hub_folder_runs_through_transformers_custom_generate():
    """The real route: transformers loads hub/custom_generate/generate.py (trust_remote_code
    required), checks its requirements, and calls it; the output and dict form equal generate's."""
    model = tiny_random_model("llama")
    ids, mask = left_padded(prompts(model.config.vocab_size, lengths=(18, 12), seed=2))
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    reference = model.generate(ids, **kwargs)
    assert torch.equal(via_hub(model, ids, lookahead={"window": 3, "ngram": 3, "guess": 3}, **kwargs), reference)
    out = via_hub(model, input_ids=ids, return_dict_in_generate=True, lookahead="greedy", **kwargs)
    assert torch.equal(out.sequences, reference) and out.scores is None
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(ids, custom_generate=HUB, **kwargs)


def built_hub(out) -> Path:
    """``make hub``'s folder, built at ``out`` by hub/build.py."""
    spec = importlib.util.spec_from_file_location("hub_build", repo_root() / "hub" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(out)


def character_tokenizer():
    """A tokenizer of the tiny models' 128 ids, each a short string (no download): stop strings
    need one. It splits text into characters; its decoder joins the strings as they are."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
    words += [a + b for a in "abcdefghij" for b in "klmnopq"][: 128 - len(words) - 1]
    vocab = {"<pad>": 0, **{w: i + 1 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Split(Regex("."), "isolated"), decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")


# Run by a fresh interpreter that cannot import the repository's packages: ``-I -S`` (no site:
# no .pth file, so not the editable install's finder either), its sys.path the test's less every
# folder holding lookahead_core or experiments, its own Hugging Face home. The base is a GQA model under SDPA.
FRESH = r"""
import json, sys, warnings
sys.path[:] = PATHS
import importlib.util
assert importlib.util.find_spec("lookahead_core") is None and importlib.util.find_spec("experiments") is None
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList

class Attention(StoppingCriteria):                   # records the attention implementation the call ran under
    seen = set()
    def __call__(self, input_ids, scores, **kwargs):
        Attention.seen.add(model.config._attn_implementation)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)

model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="sdpa").eval()
tokenizer = AutoTokenizer.from_pretrained(MODEL)
hub = dict(custom_generate=REPO, trust_remote_code=True)
base = dict(do_sample=False, pad_token_id=0)
ids = torch.tensor([PROMPTS[0]])
padded, mask = torch.tensor(PADDED), torch.tensor(MASK)
results = {}

def case(name, reference, **kwargs):
    out = model.generate(**kwargs, **hub)
    out = out if isinstance(out, torch.Tensor) else out.sequences
    results[name] = [torch.equal(out, reference), out.shape[1] - kwargs["input_ids"].shape[1]]

free = model.generate(ids, max_new_tokens=40, eos_token_id=None, **base)
case("greedy, the paper's window (Hub snapshot)", free, input_ids=ids, max_new_tokens=40, eos_token_id=None,
     lookahead="lookahead", **base)
case("auto, its latency curve from a file", free, input_ids=ids, max_new_tokens=40, eos_token_id=None,
     lookahead="auto", latency_curve=CURVE, **base)
eos = int(padded[0, -1])
batch = model.generate(padded, attention_mask=mask, max_new_tokens=24, eos_token_id=eos, **base)
case("left-padded batch of 3, EOS", batch, input_ids=padded, attention_mask=mask, max_new_tokens=24,
     eos_token_id=eos, lookahead={"window": 3, "ngram": 3, "guess": 3, "prompt_pool": True}, **base)
text = tokenizer.decode(free[0, ids.shape[1]:])
stop = tokenizer.decode(free[0, ids.shape[1] + 20: ids.shape[1] + 22])
stopped = model.generate(ids, max_new_tokens=40, eos_token_id=None, stop_strings=[stop], tokenizer=tokenizer, **base)
assert stopped.shape[1] < free.shape[1], "the stop string never fired: the case tests nothing"
case("stop strings", stopped, input_ids=ids, max_new_tokens=40, eos_token_id=None, stop_strings=[stop],
     tokenizer=tokenizer, lookahead={"window": 4, "ngram": 3, "guess": 4, "tree": True, "sources": {"suffix": 3}},
     **base)
case("return_dict_in_generate", free, input_ids=ids, max_new_tokens=40, eos_token_id=None,
     return_dict_in_generate=True, lookahead="greedy", **base)
hub["custom_generate"] = FOLDER
case("the built folder as a local path", free, input_ids=ids, max_new_tokens=40, eos_token_id=None,
     lookahead="lookahead", stopping_criteria=StoppingCriteriaList([Attention()]), **base)
refusals = {}
for name, kwargs in (("unknown lookahead key", {"lookahead": {"windw": 3}}), ("unknown option", {"windw": 3}),
                     ("unsupported option", {"num_beams": 2})):
    try:
        model.generate(ids, max_new_tokens=4, **base, **hub, **kwargs)
        refusals[name] = "not refused"
    except ValueError as error:
        refusals[name] = str(error)
print(json.dumps({"results": results, "refusals": refusals, "during": sorted(Attention.seen),
                  "after": model.config._attn_implementation,
                  "loaded": sorted({m.split(".")[0] for m in sys.modules} & {"lookahead_core", "experiments"})}))
"""


def test_the_built_hub_folder_loads_as_a_hub_repository_without_the_clone(tmp_path):
    """``make hub``'s folder, as the Hub serves it (a snapshot in the Hugging Face cache, loaded
    offline by its repository id) and as a local path, in a fresh process where neither
    lookahead_core nor the harness can be imported: greedy equals generate's token for token
    (alone, from auto with a curve file, in a left-padded batch ending at EOS, with stop strings,
    as a dict), bad input is refused naming it, and the GQA model's attention is its own again."""
    import json
    import subprocess
    import sys

    folder = built_hub(tmp_path / "built")
    commit = "0123456789abcdef0123456789abcdef01234567"
    cached = tmp_path / "home" / "hub" / "models--lookahead--decoding"
    shutil.copytree(folder, cached / "snapshots" / commit)
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text(commit)
    model = tiny_random_model("llama")
    assert model.config.num_key_value_heads < model.config.num_attention_heads       # GQA: the switched case
    model.save_pretrained(tmp_path / "model")
    character_tokenizer().save_pretrained(tmp_path / "model")
    (tmp_path / "curve.json").write_text(json.dumps({"rows": FLAT.to_rows()}))
    rows = prompts(model.config.vocab_size, lengths=(20, 13, 17), seed=1)
    padded, mask = left_padded(rows)
    # (less a transformers modules cache an earlier custom_generate call of this process put there too)
    paths = [p for p in sys.path
             if p and not any((Path(p) / name).exists() for name in ("lookahead_core", "experiments", "transformers_modules"))]
    script = FRESH
    for name, value in (("PATHS", paths), ("MODEL", str(tmp_path / "model")), ("REPO", "lookahead/decoding"),
                        ("FOLDER", str(folder)), ("CURVE", str(tmp_path / "curve.json")), ("PROMPTS", rows),
                        ("PADDED", padded.tolist()), ("MASK", mask.tolist())):
        script = script.replace(name, repr(value), 1) if name in ("PATHS",) else script.replace(name, repr(value))
    (tmp_path / "fresh.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    ran = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "fresh.py")], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-4000:]
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))                   # the cases and their results (pytest -s shows them)
    assert report["loaded"] == []
    assert len(report["results"]) == 6 and all(equal for equal, _ in report["results"].values()), report["results"]
    assert report["results"]["stop strings"][1] < 40
    refusals = report["refusals"]
    assert "`lookahead` has no key `windw`" in refusals["unknown lookahead key"]
    assert "`windw` is neither a generation option" in refusals["unknown option"]
    assert "`num_beams=2` is not supported" in refusals["unsupported option"]
    assert report["during"] == ["lookahead_gqa_sdpa"] and report["after"] == "sdpa"


def test_the_card_and_requirements_say_what_the_folder_needs_and_was_tested_with(tmp_path):
    """The built folder's card has transformers' custom_generate sections and a base model; its
    requirements are the decoder's own (torch as pyproject.toml, transformers as
    lookahead_core.TRANSFORMERS, one bound a line as transformers' check reads them), nothing a
    registry does not serve; every vendored module names its source."""
    import re
    import tomllib

    from lookahead_core import TRANSFORMERS

    folder = built_hub(tmp_path / "built")
    card = (folder / "README.md").read_text()
    assert "custom_generate" in card.split("---")[1] and "base_model:" in card.split("---")[1]
    for section in ("Base model", "Model compatibility", "Additional arguments", "Output type changes",
                    "What it changes on the model", "Tested transformers versions"):
        assert f"\n## {section}\n" in card, section
    low, high = re.fullmatch(r"transformers>=([\d.]+),<([\d.]+)", TRANSFORMERS).groups()
    assert f"`transformers>={low}` and `<{high}`" in card and f"transformers {low}.0 (the lower bound" in card
    torch_requirement = next(r for r in tomllib.loads((repo_root() / "pyproject.toml").read_text())["project"]
                             ["dependencies"] if r.startswith("torch"))
    lines = (folder / "custom_generate" / "requirements.txt").read_text().split()
    assert lines == [torch_requirement, f"transformers>={low}", f"transformers<{high}"]
    private = set(re.findall(r"model\.(_[a-z_]+)\(", (repo_root() / "lookahead_core" / "generate.py").read_text()))
    assert private and all(f"`{name}`" in card for name in private), private
    for module in (folder / "custom_generate").glob("*.py"):
        source = re.match(r"# Vendored from (lookahead_core/\S+\.py) by `make hub`", module.read_text()).group(1)
        assert (repo_root() / source).is_file()


@pytest.mark.parametrize(("width", "call", "model_default"), [
    (10, {}, {}),                                   # nothing set: 20 new tokens ...
    (30, {}, {}),                                   # ... whatever the input's length
    (250, {}, {}),                                  # ... within max_position_embeddings (256): 6
    (10, {"max_length": 17}, {}),                   # max_length counts the input
    (10, {"max_new_tokens": 7}, {}),
    (10, {}, {"max_length": 25}),                   # the model's generation config, counted the same ways
    (30, {}, {"max_new_tokens": 9}),
    (10, {"max_new_tokens": 5}, {"max_length": 40}),
], ids=["none-short", "none-long", "none-position-limit", "max_length", "max_new_tokens", "config-max_length",
        "config-max_new_tokens", "call-over-config"])
def test_lengths_follow_generates_rules(width, call, model_default):
    """Issue 58: with no length the folder returned 20 tokens in all (and refused a prompt over 20)
    where generate returns 20 new ones."""
    model = tiny_family_model("llama")
    model.generation_config.update(**model_default)
    ids = torch.tensor(prompts(model.config.vocab_size, lengths=(width,), seed=3))
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0, **call)
    reference = model.generate(ids, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = via_hub(model, ids, lookahead="lookahead", **kwargs)
    assert torch.equal(out, reference), (out.shape, reference.shape)
    default_warned = any("model-agnostic default `max_length`" in str(w.message) for w in caught)
    assert default_warned == (not call and not model_default)        # generate's warning, when it gives it


@pytest.mark.slow
def test_smollm2_chat_prompts_equal_generate_alone_and_batched():
    model, tokenizer = load_model("smollm2_135m")
    questions = ["Write a Python function that reverses a string.", "What is the capital of France? Answer briefly.",
                 "List three prime numbers."]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in questions]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=48, do_sample=False)
    reference = model.generate(**batch, **kwargs)
    assert torch.equal(lookahead_generate(model, **batch, lookahead="auto", latency_curve=FLAT, **kwargs), reference)
    single = tokenizer(texts[0], return_tensors="pt")
    alone = model.generate(**single, **kwargs)
    assert torch.equal(via_hub(model, **single, lookahead={"window": 5, "ngram": 4, "guess": 5, "prompt_pool": True},
                               **kwargs), alone)


def test_sampling_keeps_the_model_distribution():
    """Draws of the first tokens through generate's sampling options (temperature, top-k, top-p
    from the generation config; seeds from torch's generator) fit the exact distribution."""
    model = tiny_random_model("llama", seed=0, vocab_size=VOCAB, initializer_range=0.05)
    from lookahead_core import SamplingConfig

    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.7, 4, 0.9)):
        probs = exact_distribution(model, SamplingConfig(temperature, top_k, top_p))
        counts, multi, draws = {}, 0, 1500
        for seed in range(draws):
            torch.manual_seed(seed)
            stats = []
            out = lookahead_generate(model, torch.tensor([PROMPT]), max_new_tokens=DEPTH, do_sample=True,
                                     temperature=temperature, top_k=top_k, top_p=top_p, eos_token_id=None,
                                     pad_token_id=0, lookahead={"window": 3, "ngram": 3, "guess": 8, "prompt_pool": True},
                                     lookahead_stats=stats)
            key = tuple(out[0, len(PROMPT):].tolist())
            counts[key] = counts.get(key, 0) + 1
            multi += any(a > 1 for a in stats[0].accepted)
        assert multi > draws // 10, "drafts were rarely accepted: the verifier was hardly exercised"
        assert chi_square_pvalue(counts, probs, draws) > 1e-3, (temperature, top_k, top_p)
    fixed = dict(max_new_tokens=8, do_sample=True, pad_token_id=0, lookahead={"window": 3, "ngram": 3, "guess": 8})
    torch.manual_seed(7)
    first = lookahead_generate(model, torch.tensor([PROMPT]), **fixed)
    torch.manual_seed(7)
    assert torch.equal(first, lookahead_generate(model, torch.tensor([PROMPT]), **fixed))   # torch's seed repeats it


class Recorder(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended += 1


def test_a_streamer_sees_the_prompt_then_every_token_once():
    model = tiny_random_model("llama")
    ids = torch.tensor(prompts(model.config.vocab_size))
    streamer = Recorder()
    stats = []
    out = lookahead_generate(model, ids, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0,
                             streamer=streamer, lookahead={"window": 3, "ngram": 3, "guess": 3, "prompt_pool": True},
                             lookahead_stats=stats)
    assert any(a > 1 for a in stats[0].accepted), "no step committed several tokens: the streamer was not tested"
    assert streamer.puts[0] == ids.tolist() and streamer.ended == 1
    assert [t for put in streamer.puts[1:] for t in put] == out[0, ids.shape[1]:].tolist()
    assert all(len(put) == 1 for put in streamer.puts[1:])
    with pytest.raises(ValueError, match="streamer takes batch size 1"):
        lookahead_generate(model, torch.cat([ids, ids]), max_new_tokens=4, streamer=Recorder(), pad_token_id=0)


class StopAfter(StoppingCriteria):
    """Stops a row once ``token`` has been generated ``times`` times (counting the prompt's)."""

    def __init__(self, token: int, times: int):
        self.token, self.times = token, times

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids == self.token).sum(dim=1) >= self.times


def test_stopping_criteria_stop_at_the_token_generate_stops_at():
    """A multi-token step is cut at the first token a criterion fires on, as generate's
    one-token steps would stop there."""
    model = tiny_random_model("llama")
    ids = torch.tensor(prompts(model.config.vocab_size))
    free = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 20:].tolist()
    token = max(set(free), key=free.count)                  # the most repeated new token
    criteria = StoppingCriteriaList([StopAfter(token, int((ids[0] == token).sum()) + 2)])
    kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0, stopping_criteria=criteria)
    reference = model.generate(ids, **kwargs)
    assert reference.shape[1] < ids.shape[1] + 40, "the criterion never fired: the test tests nothing"
    for options in OPTIONS:
        assert torch.equal(lookahead_generate(model, ids, **options, **kwargs), reference), options


@pytest.mark.slow
def test_stop_strings_and_max_length_as_generate_reads_them():
    model, tokenizer = load_model("smollm2_135m")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}],
                                         tokenize=False, add_generation_prompt=True)
    batch = tokenizer(text, return_tensors="pt")
    width = batch.input_ids.shape[1]
    free = model.generate(**batch, do_sample=False, max_new_tokens=64)[0, width:].tolist()
    stop = tokenizer.decode(free[20:22]).strip()              # words from the middle of the free output
    kwargs = dict(do_sample=False, stop_strings=[stop], tokenizer=tokenizer, max_new_tokens=64)
    reference = model.generate(**batch, **kwargs)
    assert reference.shape[1] - width < len(free) and tokenizer.decode(reference[0, width:]).endswith(stop)
    assert torch.equal(lookahead_generate(model, **batch, lookahead={"window": 4, "ngram": 3, "guess": 4}, **kwargs),
                       reference)
    short = model.generate(**batch, do_sample=False, max_length=width + 5)
    assert torch.equal(lookahead_generate(model, **batch, lookahead="lookahead", do_sample=False, max_length=width + 5),
                       short)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_beams": 2}, "num_beams=2"),
    ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences=2"),
    ({"output_scores": True, "return_dict_in_generate": True}, "output_scores=True"),
    ({"output_hidden_states": True, "return_dict_in_generate": True}, "output_hidden_states=True"),
    ({"repetition_penalty": 1.3}, "RepetitionPenaltyLogitsProcessor"),
    ({"no_repeat_ngram_size": 2}, "NoRepeatNGramLogitsProcessor"),
    ({"min_new_tokens": 4, "eos_token_id": 5}, "MinLengthLogitsProcessor"),   # min_new_tokens, as generate reads it
    ({"do_sample": True, "min_p": 0.1}, "MinPLogitsWarper"),
    ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens=3"),
    ({"cache_implementation": "static"}, "cache_implementation"),
    ({"use_cache": False}, "use_cache=False"),
    ({"stop_strings": ["x"]}, "needs `tokenizer=`"),
    ({"lookahead": "fastest"}, "must be one of auto, lookahead, greedy"),
    ({"lookahead": {"window": 0}}, "window"),
    ({"windw": 3}, "`windw` is neither a generation option nor one of this decoder's"),
    ({"max_length": 10, "max_new_tokens": None}, "`max_length` is set to 10"),
])
def test_what_the_loop_cannot_serve_is_refused_naming_it(kwargs, match):
    model = tiny_random_model("llama")
    ids = torch.tensor(prompts(model.config.vocab_size))
    with pytest.raises(ValueError, match=match):
        lookahead_generate(model, ids, **{"max_new_tokens": 4, "pad_token_id": 0, **kwargs})


def test_arguments_of_generate_it_cannot_run_are_refused():
    model = tiny_random_model("llama")
    ids = torch.tensor(prompts(model.config.vocab_size))
    with pytest.raises(ValueError, match="`assistant_model` is not supported"):
        lookahead_generate(model, ids, max_new_tokens=4, assistant_model=tiny_random_model("llama"))
    with pytest.raises(ValueError, match="`prefix_allowed_tokens_fn` is not supported"):
        lookahead_generate(model, ids, max_new_tokens=4, prefix_allowed_tokens_fn=lambda b, x: [1])
    mask = torch.ones_like(ids)
    mask[0, -1] = 0                                           # right padding
    with pytest.raises(ValueError, match="must be left padding"):
        lookahead_generate(model, ids, attention_mask=mask, max_new_tokens=4)


def test_auto_measures_a_curve_once_per_model_and_kv_bucket():
    """Without ``latency_curve``, auto measures the device's step costs on the first call and
    reuses them for calls whose KV length falls in the same bucket."""
    from lookahead_core import generate as module

    model = tiny_random_model("llama")
    ids = torch.tensor(prompts(model.config.vocab_size))
    reference = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    for _ in range(2):
        out = lookahead_generate(model, ids, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out, reference)
    state = module._STATES[model]
    assert list(state.curves) == [64] and state.curves[64].host_seconds > 0
    assert state.prior.counts.table(), "auto learnt no draft acceptance from its calls"


def test_the_harness_runs_the_folder_beside_decode_with_the_same_tokens_and_steps(tmp_path):
    """``decoding=hf_custom``: transformers' generate with the hub folder, in a run.py job beside
    the core decoder of the same config; every row equals greedy, and the two routes take the same
    steps (the wrapper adds time, never a different algorithm)."""
    from hydra import compose, initialize_config_dir

    from conftest import DATA_ROOT
    from experiments.config.schema import register_configs
    from experiments.job import runner
    from experiments.reporting import report

    register_configs()
    same = "window:3,ngram:3,guess:3,prompt_pool:true"
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=tiny_llama", "threads=1", "warmup=1", "experiment=mtbench", "dataset.limit=2",
            "experiment.max_new_tokens=24", "baseline=hf_greedy",
            f"decoders=[{{use:lookahead,{same}}},{{use:hf_custom,{same}}}]",
            f"data_root={DATA_ROOT}", f"results_dir={tmp_path}"])
    threads = torch.get_num_threads()
    try:
        rows = report.load_results([runner.run(cfg)])
    finally:
        torch.set_num_threads(threads)
    assert sorted(set(rows.decoder)) == ["hf_custom", "hf_greedy", "lookahead"] and len(rows) == 2 * 2 * 3
    tested = rows[~rows.baseline]
    assert tested.matches_greedy.all()
    pairs = tested.pivot_table(index=["item_id", "turn"], columns="decoder", values="steps")
    assert pairs.notna().all().all()
    first_turns = rows[rows.turn == 1].pivot_table(index="item_id", columns="decoder", values="steps")
    assert (first_turns.hf_custom == first_turns.lookahead).all()      # turn 1: the same prompt, the same steps
    assert (tested[tested.decoder == "hf_custom"].W == 3).all() and tested.accepted_hist.notna().all()


def test_options_come_from_the_generation_config_and_a_curve_from_a_file(tmp_path):
    """``lookahead`` set on the model's generation config is used when the call names none (the
    call's wins); ``latency_curve`` may be a JSON file of the curve's rows, as the harness caches them."""
    import json

    from lookahead_core import generate as module

    model = tiny_random_model("llama")
    ids = torch.tensor(prompts(model.config.vocab_size))
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    reference = model.generate(ids, **kwargs)
    model.generation_config.lookahead = {"window": 4, "ngram": 3, "guess": 4}
    stats = []
    assert torch.equal(lookahead_generate(model, ids, lookahead_stats=stats, **kwargs), reference)
    assert max(stats[0].step_tokens) > 1 and not module._STATES[model].curves   # lookahead steps, not auto's
    with pytest.raises(ValueError, match="`lookahead` must be one of"):
        lookahead_generate(model, ids, lookahead="nope", **kwargs)     # the call's option wins
    path = tmp_path / "curve.json"
    path.write_text(json.dumps({"rows": FLAT.to_rows()}))
    del model.generation_config.lookahead
    assert torch.equal(lookahead_generate(model, ids, lookahead="auto", latency_curve=str(path), **kwargs), reference)
    assert not module._STATES[model].curves                           # nothing measured: the file's curve served


def test_the_call_cost_script_times_every_route(capsys):
    """scripts/generate_call_cost.py (results/generate/README.md quotes it): each route's median,
    the three routes decoding the same call."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_call_cost", repo_root() / "scripts" / "generate_call_cost.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    threads = torch.get_num_threads()
    try:
        medians = script.main(["--rounds", "3"])
    finally:
        torch.set_num_threads(threads)
    assert list(medians) == ["decode_batch", "lookahead_core.generate.generate", 'model.generate(custom_generate="hub")']
    assert all(ms > 0 for ms in medians.values()) and "(median of 3)" in capsys.readouterr().out
