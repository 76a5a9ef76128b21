"""A draft source is one class: registered from this file alone, it is validated, named, built into
the token tree, fingerprinted, put into ``decoding=auto``'s grid and taken by the harness' yaml, and
whatever it proposes the output stays token-identical to greedy decoding (fp32, tiny random models).
The worked example of docs/draft_sources.md is run as written."""

from __future__ import annotations

import re
import sys

import pytest
from hydra import compose, initialize_config_dir

from experiments.config.errors import ConfigError
from experiments.config.schema import register_configs
from experiments.config.settings import to_settings
from experiments.data.datasets import repo_root
from experiments.models.tiny import tiny_random_model
from lookahead_core import DecodeLimits, LookaheadConfig, decode
from experiments.config.identity import differing
from experiments.config.labels import config_label
from lookahead_core.cost.grid import default_grid
from lookahead_core.layout import Draft
from lookahead_core.sources import SOURCES, register_source, unregister_source
from tests.test_lossless import repetitive_prompt

ARCHS = ("llama", "mistral", "qwen2", "gemma3")
NEW = 40
register_configs()


class LastSeen:
    """Toy source: where the last token occurred before, the tokens that followed it (the latest
    ``size`` occurrences), and, as a deliberately bad draft, the last token repeated."""

    topk = 0
    built = 0

    def __init__(self, size: int, depth: int) -> None:
        self.size, self.depth = size, depth
        self.proposed = 0
        LastSeen.built += 1

    @classmethod
    def from_config(cls, config, size, context):
        return cls(size, config.draft_depth)

    def propose(self, context):
        last, drafts = context[-1], []
        for start in range(len(context) - 2, -1, -1):
            if context[start] == last and len(drafts) < self.size:
                tokens = tuple(context[start + 1:start + 1 + self.depth])
                if tokens:
                    drafts.append(Draft(tokens, ("toy",) * len(tokens)))
        drafts.append(Draft((last,) * self.depth, ("toy",) * self.depth))
        self.proposed += len(drafts)
        return drafts

    def update(self, outcome):
        assert outcome.new_from <= len(outcome.context)


def toy_grid():
    return [LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, sources={"toy": 3}),
            LookaheadConfig(window=5, ngram=4, guess=5, tree=True, sources={"toy": 2})]


@pytest.fixture()
def toy():
    register_source("toy", label="ty", grid=toy_grid)(LastSeen)
    yield SOURCES["toy"]
    unregister_source("toy")


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    return request.param, tiny_random_model(request.param, seed=1)


CONFIGS = [
    dict(window=3, ngram=3, guess=4, tree=True, sources={"toy": 2}),
    dict(window=5, ngram=4, guess=6, prompt_pool=True, tree=True, sources={"suffix": 3, "recycle": 3, "toy": 3}),
    dict(window=4, ngram=4, guess=4, tree=True, sources={"toy": 4}, depth=6, budget=24),
    dict(window=3, ngram=3, guess=3, sources={"toy": 2}),                            # linear branches
    dict(window=1, ngram=4, guess=0, pool_only=True, tree=True, sources={"toy": 3}),  # the only source
    dict(window=1, ngram=5, guess=0, pool_only=True, tree=True, sources={"toy": 4}, budget=3),
]


def test_a_registered_source_decodes_losslessly_and_is_measured(toy, arch_model) -> None:
    arch, model = arch_model
    prompt = repetitive_prompt(model.config.vocab_size)
    limits = DecodeLimits(max_new_tokens=NEW)
    reference = decode(model, prompt, None, limits).tokens
    accepted = 0
    for values in CONFIGS:
        config = LookaheadConfig(**values)
        built = LastSeen.built
        out = decode(model, prompt, config, limits)
        assert out.tokens == reference, f"{arch} {config_label(config)}"
        assert LastSeen.built == built + 1, "the proposer did not build the registered source"
        fed = {depth: n for (tag, depth), n in out.stats.drafts.counts.fed.items() if tag == "toy"}
        assert fed, f"{arch} {config_label(config)}: no toy draft was fed"
        assert max(fed) <= config.draft_depth
        accepted += sum(n for (tag, _), n in out.stats.drafts.counts.accepted.items() if tag == "toy")
    assert accepted > 0, "no toy draft was ever accepted: the test is too weak"


def test_a_config_validates_names_and_sizes_of_sources(toy) -> None:
    config = LookaheadConfig(window=5, ngram=4, guess=5, tree=True, sources={"toy": 2})
    assert config.sources == (("toy", 2),)
    assert LookaheadConfig(window=5, ngram=4, guess=5, sources=[("toy", 0)]).sources == ()
    assert LookaheadConfig(window=5, ngram=4, guess=5, sources={"toy": 2}) != LookaheadConfig(window=5, ngram=4, guess=5)
    assert hash(config) == hash(LookaheadConfig(window=5, ngram=4, guess=5, tree=True, sources=[["toy", 2]]))
    # the toy's drafts count in the step's token ceiling
    plain = LookaheadConfig(window=5, ngram=4, guess=5, tree=True)
    assert config.max_tokens_per_step == plain.max_tokens_per_step + 2 * config.draft_depth
    for bad, message in [({"nope": 2}, "'nope' is not a registered source"),
                         ({"toy": -1}, "toy must be an int >= 0"),
                         ({"toy": "2"}, "toy must be an int >= 0"),
                         ([("toy", 1), ("toy", 2)], "a name is given twice"),
                         ("toy", "sources must map")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            LookaheadConfig(window=5, ngram=4, guess=5, sources=bad)
    # pool_only with no other source is fine when a registered one drafts
    assert LookaheadConfig(ngram=4, guess=0, pool_only=True, sources={"toy": 1}).pool_only
    with pytest.raises(ValueError, match="pool_only needs a draft source"):
        LookaheadConfig(ngram=4, guess=0, pool_only=True, sources={"toy": 0})


def test_registration_refuses_bad_names_and_built_in_removal_and_labels_refuse_taken_labels(toy) -> None:
    """The core checks a source's name; the harness's labels (experiments/config/labels.py) refuse a
    label another source or a word of theirs holds, when they name a config with that source."""
    for label in ("sfx", "rc", "rw", "tree", "k", "ty", "Bad"):
        register_source("other", label=label)(LastSeen)
        try:
            with pytest.raises(ValueError, match="cannot name it"):
                config_label(LookaheadConfig(window=5, ngram=4, guess=5, sources={"other": 1}))
        finally:
            unregister_source("other")
    with pytest.raises(ValueError, match="identifier"):
        register_source("bad name", label="bn")(LastSeen)
    with pytest.raises(ValueError, match="not a registered source that can be removed"):
        unregister_source("suffix")
    assert "other" not in SOURCES


def test_the_name_and_grid_know_it(toy) -> None:
    config = LookaheadConfig(window=5, ngram=4, guess=5, tree=True, sources={"suffix": 2, "toy": 3}, budget=30)
    assert config_label(config) == "la_N4W5G5_tree_sfx2_ty3_k30"
    assert config_label(LookaheadConfig(window=5, ngram=4, guess=5, sources={"toy": 1})) == "la_N4W5G5_ty1"
    grid = default_grid()
    assert all(c in grid for c in toy_grid())
    assert len(set(map(config_label, grid))) == len(grid), "two grid configs share a name"
    unregister_source("toy")
    try:
        assert not any(name == "toy" for c in default_grid() for name, _ in c.sources)
    finally:
        register_source("toy", label="ty", grid=toy_grid)(LastSeen)


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_the_harness_takes_it_from_yaml_and_names_its_results_by_it(toy) -> None:
    plain = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_tree"))
    toyed = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_tree", "+decoding.sources.toy=2"))
    (decoder,) = toyed.candidates
    assert decoder.config.sources == (("recycle", 4), ("suffix", 4), ("toy", 2))
    assert "_ty2" in config_label(decoder.config)
    assert toyed.results_path().name.startswith("lookahead_tree-")
    assert toyed.fingerprint() != plain.fingerprint()
    assert differing(decoder)[2]["sources"] == {"suffix": 4, "recycle": 4, "toy": 2}
    assert differing(plain.candidates[0])[2]["sources"] == {"suffix": 4, "recycle": 4}   # the yaml's
    with pytest.raises(ConfigError, match=r"decoding.*'nope' is not a registered source"):
        to_settings(compose_config("experiment=mtbench", "decoding=lookahead_tree", "+decoding.sources.nope=2"))


def test_sources_size_the_built_in_sources() -> None:
    sourced = to_settings(compose_config("experiment=mtbench", "decoding=lookahead", "+decoding.sources.suffix=4",
                                         "+decoding.sources.recycle=2", "decoding.tree=true"))
    (decoder,) = sourced.candidates
    assert decoder.config.sources == (("recycle", 2), ("suffix", 4))
    assert config_label(decoder.config) == "la_N5W15G15_tree_sfx4_rc2"
    resized = to_settings(compose_config("experiment=mtbench", "decoding=tree", "decoding.sources.suffix=2"))
    assert resized.candidates[0].config.sources == (("recycle", 4), ("suffix", 2))
    with pytest.raises(ConfigError, match=r"^decoding: sources: recycle must be an int >= 0"):
        to_settings(compose_config("experiment=mtbench", "decoding=tree", "decoding.sources.recycle=-1"))


def test_plugins_import_a_module_that_registers_a_source(tmp_path, monkeypatch) -> None:
    (tmp_path / "toy_plugin_for_tests.py").write_text(
        "from lookahead_core.sources import register_source\n"
        "from tests.test_draft_sources import LastSeen\n"
        "register_source('plug', label='pl')(LastSeen)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"plug' is not a registered source"):
            to_settings(compose_config("experiment=mtbench", "+decoding.sources.plug=2"))
        settings = to_settings(compose_config("experiment=mtbench", "plugins=[toy_plugin_for_tests]", "+decoding.sources.plug=2"))
        assert settings.candidates[0].config.sources == (("plug", 2),)
        with pytest.raises(ConfigError, match=r"^plugins: cannot import 'no_such_plugin_module'"):
            to_settings(compose_config("plugins=[no_such_plugin_module]"))
    finally:
        SOURCES.pop("plug", None)
        sys.modules.pop("toy_plugin_for_tests", None)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_documented_example_registers_and_decodes_losslessly() -> None:
    first, usage = python_blocks((repo_root() / "docs" / "draft_sources.md").read_text())
    namespace: dict = {}
    exec(compile(first, "docs/draft_sources.md", "exec"), namespace)
    try:
        assert SOURCES["bigram"].factory is namespace["BigramSource"]
        model = tiny_random_model("llama", seed=1)
        prompt_ids = repetitive_prompt(model.config.vocab_size)
        exec(compile(usage, "docs/draft_sources.md", "exec"), {"model": model, "prompt_ids": prompt_ids}, namespace)
        assert config_label(namespace["config"]) == "la_N4W5G5_tree_bg2"
        out = namespace["out"]
        assert out.tokens == decode(model, prompt_ids, None, DecodeLimits(max_new_tokens=128)).tokens
        assert any(tag == "bigram" for tag, _ in out.stats.drafts.counts.fed)
    finally:
        unregister_source("bigram")

