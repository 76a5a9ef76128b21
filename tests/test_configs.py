"""Every option of every config group composes and converts to the core's dataclasses; a bad
override fails with one line naming its key, before any model is loaded and before torch is imported."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.job import runner

from experiments.data.datasets import repo_root
from experiments.decoders.registry import DECODERS, AutoDecoder, CoreDecoder, Decoder, HFGenerate
from experiments.config.errors import ConfigError
from experiments.config.settings import RunSettings, decoding_options, load_option, to_settings
from experiments.config.identity import differing, readable
from experiments.config.schema import register_configs
from lookahead_core import DecodeLimits, LookaheadConfig, SamplingConfig

from conftest import DATA_ROOT  # the full data when present, else tests/fixtures/data

CONF = repo_root() / "conf"
register_configs()


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def compose_config(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(runner.model_loader, "load_model", refuse)


def check_settings(settings: RunSettings) -> None:
    assert isinstance(settings.sampling, SamplingConfig)
    assert isinstance(settings.limits, DecodeLimits)
    assert isinstance(settings.baseline, Decoder) and settings.baseline not in settings.candidates
    for decoder in settings.decoders:
        assert decoder.kind in DECODERS and isinstance(decoder, DECODERS[decoder.kind])
        if type(decoder) is CoreDecoder:
            assert decoder.config is None or isinstance(decoder.config, LookaheadConfig)
    assert settings.results_path().suffix == ".csv"


@pytest.mark.parametrize("group", ["model", "experiment", "decoding"])
def test_every_option_composes_and_converts(group: str) -> None:
    assert options(group), f"conf/{group} is empty"
    for option in options(group):
        cfg = compose_config(f"{group}={option}")
        check_settings(to_settings(cfg))


def test_every_decoding_option_names_itself_and_is_listable() -> None:
    for option in decoding_options():
        assert load_option(option)["name"] == option, f"conf/decoding/{option}.yaml must set name: {option}"
    greedy = [o for o in decoding_options() if load_option(o).get("temperature", 0) == 0
              and not load_option(o).get("item_temperature")]
    settings = to_settings(compose_config("experiment=mtbench", f"decoders=[{','.join(greedy)}]"))
    assert {d.name for d in settings.decoders} == set(greedy)


def test_core_decoders_take_every_lookahead_config_field() -> None:
    """A field added to LookaheadConfig is a yaml key at once (issue: token trees add fields); ``heads``
    and ``drafter`` (where trained drafters come from) are the keys beside them."""
    keys = {f.name for f in dataclasses.fields(CoreDecoder.Params)}
    assert keys == ({"lookahead", "heads", "drafter"}
                    | {f.name for f in dataclasses.fields(LookaheadConfig)} - {"seed"})
    settings = to_settings(compose_config("experiment=mtbench", "decoding.keep_pool=false", "decoding.window=4"))
    assert settings.candidates[0].config == LookaheadConfig(window=4, ngram=5, guess=15, keep_pool=False)


def test_the_default_is_the_demo_that_runs_anywhere() -> None:
    settings = to_settings(compose_config())
    assert (settings.model.name, settings.experiment, settings.dataset.name) == ("smollm2_135m", "demo", "humaneval")
    assert (settings.dataset.limit, settings.limits.max_new_tokens) == (4, 128)
    assert settings.baseline.name == "hf_greedy" and isinstance(settings.baseline, HFGenerate)
    assert [d.name for d in settings.candidates] == ["hf_pld", "lookahead", "auto"]
    assert settings.candidates[1].config == LookaheadConfig(5, 4, 5)
    assert isinstance(settings.candidates[2], AutoDecoder)
    assert settings.config_tag == "hf_pld+lookahead+auto"


@pytest.mark.parametrize("decoding,baseline,candidate", [
    ("greedy", "greedy", None),
    ("sampling", "sampling", None),
    ("lookahead", "greedy", "lookahead"),
    ("lookahead_pool", "greedy", "lookahead_pool"),
    ("pool_only", "greedy", "pool_only"),
    ("lookahead_sampling", "sampling", "lookahead_sampling"),
    ("auto", "greedy", "auto"),
    ("tree", "greedy", "tree"),
    ("lookahead_tree", "greedy", "lookahead_tree"),
    ("hf_greedy", "greedy", "hf_greedy"),
    ("hf_sampling", "sampling", "hf_sampling"),
    ("hf_pld", "greedy", "hf_pld"),
    ("hf_assisted", "greedy", "hf_assisted"),
    ("hf_early_exit", "greedy", "hf_early_exit"),
])
def test_decoders_and_tags(decoding: str, baseline: str, candidate: str | None) -> None:
    """A job's readable name is its decoders' row names: the yaml's name (or the user's ``name:``)."""
    settings = to_settings(compose_config("experiment=mtbench", f"decoding={decoding}"))
    assert settings.baseline.name == baseline
    assert ([d.name for d in settings.candidates] or [None]) == [candidate]
    assert settings.config_tag == (candidate or baseline)
    assert settings.results_path().name.startswith(f"{candidate or baseline}-h")


def test_a_list_of_decoders_takes_variants_and_the_shared_values() -> None:
    settings = to_settings(compose_config(
        "experiment=mtbench", "baseline=hf_greedy", "decoding.ngram=4",
        "decoders=[hf_pld,lookahead,{use:lookahead,name:la7,window:7},{use:hf_pld,name:pld10,k:10},auto]"))
    by_name = {d.name: d for d in settings.decoders}
    assert list(by_name) == ["hf_greedy", "hf_pld", "lookahead", "la7", "pld10", "auto"]
    assert by_name["lookahead"].config == LookaheadConfig(15, 4, 15) and by_name["la7"].config == LookaheadConfig(7, 4, 15)
    assert (by_name["hf_pld"].params.k, by_name["pld10"].params.k) == (3, 10)
    assert settings.config_tag == "hf_pld+lookahead+la7+pld10+auto"
    # The baseline listed again is the baseline, not a second decoder.
    assert [d.name for d in to_settings(compose_config("experiment=mtbench", "decoders=[greedy,lookahead]")).decoders] \
        == ["greedy", "lookahead"]


def test_experiment_values_follow_the_reference_conventions() -> None:
    budgets = {"mtbench": 1024, "humaneval": 512, "classeval": 2048, "cnndm": 1024, "xsum": 1024, "mbpp": 512,
               "specbench": 1024}
    for experiment, budget in budgets.items():
        settings = to_settings(compose_config(f"experiment={experiment}"))
        assert settings.limits.max_new_tokens == budget
        assert settings.sampling.greedy == (experiment not in ("cnndm", "xsum"))
    assert to_settings(compose_config("experiment=humaneval")).prompt_format.value == "raw"
    assert to_settings(compose_config("experiment=mtbench")).dataset.turns == 2
    specbench = to_settings(compose_config("experiment=specbench", "dataset.categories=[translation,rag]"))
    assert specbench.dataset.order.value == "spread" and specbench.dataset.categories == ["translation", "rag"]
    assert specbench.baseline.name == "hf_greedy"
    llama3 = to_settings(compose_config("model=llama3_8b")).model
    assert llama3.dtype.value == "float16" and {128001, 128009} <= set(llama3.extra_eos_token_ids)


@pytest.mark.parametrize("sweep", options("sweep"))
def test_every_sweep_value_composes(sweep: str) -> None:
    params = compose_config(f"sweep={sweep}", hydra=True).hydra.sweeper.params
    assert params
    for key, values in params.items():
        for value in str(values).split(","):
            check_settings(to_settings(compose_config(f"sweep={sweep}", f"{key}={value}")))


def test_smollm2_grid_ties_guess_to_window() -> None:
    settings = to_settings(compose_config("sweep=smollm2_wn", "decoding.window=7"))
    assert settings.candidates[0].config.guess == 7


@pytest.mark.parametrize("override,key", [
    ("decoding.window=abc", "decoding.window"),
    ("experiment=mtbench decoding.window=abc", "decoding.window"),
    ("decoding.window=0", "decoding.window"),
    ("experiment=mtbench decoding.ngram=1", "decoding.ngram"),
    ("experiment=mtbench decoding.guess=-1", "decoding.guess"),
    ("decoding.top_p=0", "top_p"),
    ("++decoding.nope=1", "decoding.nope"),
    ("experiment=mtbench decoding=hf_pld decoding.k=0", "decoding.k"),
    ("experiment=mtbench decoding=hf_assisted decoding.schedule=fast", "decoding.schedule"),
    ("decoders=[lookahead,nope]", "decoders[1]"),
    ("decoders=[lookahead,lookahead]", "decoders"),
    ("decoders=[lookahead,lookahead_sampling]", "decoders"),
    ("baseline=nope", "baseline"),
    ("model=nonexistent", "model"),
    ("experiment=nope", "experiment"),
    ("model.dtype=float64", "model.dtype"),
    ("model.attn_implementation=flash_attention_2", "model.attn_implementation"),
    ("model.typo=1", "model.typo"),
    ("experiment.max_new_tokens=0", "max_new_tokens"),
    ("dataset.limit=-1", "dataset.limit"),
    ("dataset.turns=0", "dataset.turns"),
    ("dataset.order=random", "dataset.order"),
    ("experiment=mbpp dataset.options.variant=weird", "dataset.options"),
    ("device=gpu", "device"),
    ("repeats=0", "repeats"),
    ("experiment=mtbench decoding=auto decoding.calibration_items=0", "decoding.calibration_items"),
    ("experiment=mtbench decoding=tree decoding.budget=1", "budget"),
    ("experiment=mtbench decoding=tree decoding.sources.suffix=-1", "suffix"),
    ("batch_size=0", "batch_size"),
    ("experiment=mtbench batch_size=2 decoders=[lookahead,hf_pld]", "batch_size: hf_pld"),
    ("experiment=mtbench batch_size=4 decoding=hf_assisted", "batch_size: hf_assisted"),
    ("experiment=mtbench batch_size=2 baseline=hf_early_exit", "batch_size: hf_early_exit"),
    ("experiment=mtbench batch_size=2 decoding=lookahead_sampling decoding.item_temperature=true", "batch_size"),
])
def test_bad_values_fail_naming_the_key_before_any_model_loads(override: str, key: str) -> None:
    with pytest.raises(Exception) as caught:
        runner.run(compose_config(*override.split()))
    assert not isinstance(caught.value, AssertionError), "the model was loaded before the config was checked"
    assert key in str(caught.value)


def run_py(*overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """run.py in a fresh interpreter that reports, at exit, whether torch was ever imported."""
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
             f"sys.argv = ['run.py', *{list(overrides)!r}]\n"
             "runpy.run_path('run.py', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", probe], cwd=repo_root(), capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("overrides,message", [
    (["decoding.window=abc"], "error: decoding.window must be int, got 'abc'"),
    (["repeats=abc"], "error: repeats: "),
    (["experiment=mtbench", "data_root=/nonexistent"], "error: mtbench: no data file"),
    (["model=qwen25_coder_05b", "model.packages=[no_such_weights_pkg]"], "error: model=qwen25_coder_05b: package"),
])
def test_a_bad_run_fails_in_one_line_before_torch_is_imported(overrides: list[str], message: str) -> None:
    done = run_py(*overrides)
    assert done.returncode == 2
    assert done.stderr.strip().startswith(message) and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "torch imported: False" in done.stdout


def test_a_prompt_format_the_items_lack_fails_before_any_model_loads(tmp_path: Path) -> None:
    cfg = compose_config("experiment=humaneval", "dataset.prompt_format=chat", f"data_root={DATA_ROOT}",
                         f"results_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"dataset\.prompt_format"):
        runner.run(cfg)


def test_paths_resolve_against_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOKAHEAD_DATA_ROOT", raising=False)
    settings = to_settings(compose_config())
    assert settings.data_root == (repo_root() / ".." / "shared" / "data").resolve()
    assert settings.results_path().is_relative_to(repo_root() / "results" / "raw" / "demo" / "smollm2_135m")
    monkeypatch.setenv("LOOKAHEAD_DATA_ROOT", "/elsewhere/data")
    assert to_settings(compose_config()).data_root == Path("/elsewhere/data")
    assert to_settings(compose_config("results_file=/x/rows.csv")).results_path() == Path("/x/rows.csv")


def test_the_results_path_depends_on_settings_not_on_the_subset() -> None:
    path = to_settings(compose_config()).results_path()
    assert to_settings(compose_config("dataset.limit=3", "dataset.offset=2")).results_path() == path
    assert to_settings(compose_config("experiment.max_new_tokens=32")).results_path() != path
    assert to_settings(compose_config("decoding.window=7")).results_path() != path
    assert to_settings(compose_config("seed=1")).results_path() != path


def test_a_result_is_named_by_the_values_that_differ_from_their_defaults() -> None:
    """The hash covers what differs from its declared default, whatever the parameter: a parameter
    added with a default renames nothing; a field declared ``ASIDE`` (it names, finds or schedules)
    never counts; every other changed value does."""
    settings = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_pool"))
    name, kind, params = differing(settings.candidates[0])
    assert (name, kind, params) == ("lookahead_pool", "core", {"prompt_pool": True})
    tree = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_pool", "decoding.tree=true"))
    assert tree.results_path() != settings.results_path() and differing(tree.candidates[0])[2]["tree"] is True
    # A parameter added later, at its default: the same name.
    later = dataclasses.make_dataclass("Later", [("new_knob", int, dataclasses.field(default=3))],
                                       bases=(CoreDecoder.Params,))
    (candidate,) = settings.candidates
    grown = CoreDecoder(candidate.name, later(**dataclasses.asdict(candidate.params)), candidate.seed)
    assert dataclasses.replace(settings, candidates=(grown,)).results_path() == settings.results_path()
    grown.params.new_knob = 4
    assert dataclasses.replace(settings, candidates=(grown,)).results_path() != settings.results_path()
    # What only names, finds or schedules leaves the hash; what changes a row does not.
    base = ("experiment=mtbench", "model=tiny_llama")
    path = to_settings(compose_config(*base), device="cpu").results_path()
    path_hash = to_settings(compose_config(*base), device="cpu").fingerprint()
    for same in ("model.cache_dir=/elsewhere", "sandbox=process", "warmup=3", "time_budget=60", "dataset.limit=2",
                 "data_root=/x", "results_dir=/y"):
        assert to_settings(compose_config(*base, same), device="cpu").fingerprint() == path_hash, same
    for other in ("model.dtype=bfloat16", "model.linear=auto", "experiment.max_new_tokens=64", "threads=2",
                  "model.attn_implementation=eager", "dataset.categories=[coding]", "repeats=3", "batch_size=2"):
        assert to_settings(compose_config(*base, other), device="cpu").results_path() != path, other
    chip = to_settings(compose_config(*base), device="cpu")
    assert dataclasses.replace(chip, device_name="A").results_path() != dataclasses.replace(chip, device_name="B").results_path()
    auto = to_settings(compose_config("experiment=mtbench", "decoding=auto"))
    again = to_settings(compose_config("experiment=mtbench", "decoding=auto", "decoding.recalibrate=true"))
    assert again.results_path() == auto.results_path() and again.candidates[0].params.recalibrate  # how, not what
    longer = to_settings(compose_config("experiment=mtbench", "decoding=auto", "decoding.calibration_tokens=64"))
    assert longer.results_path() != auto.results_path()


def test_a_results_file_name_stays_readable_and_short() -> None:
    """``<decoders>-<hash>-s<seed>``: the decoders' row names while they fit in 80 characters, else
    the first and how many more; the hash tells the jobs apart either way."""
    few = to_settings(compose_config("experiment=mtbench", "decoders=[hf_pld,lookahead,auto]"))
    assert few.results_path().name == f"hf_pld+lookahead+auto-{few.fingerprint()}-s0.csv"
    names = [f"decoder_number_{i}" for i in range(8)]
    many = to_settings(compose_config("experiment=mtbench", "decoders=[" + ",".join(
        f"{{use:lookahead,name:{n},window:{i + 2}}}" for i, n in enumerate(names)) + "]", "seed=12"))
    name = many.results_path().name + ".gz"
    assert name == f"decoder_number_0+7-more-{many.fingerprint()}-s12.csv.gz" and len(name) <= 80
    assert readable(["x" * 200], 0) == "x" * (80 - len("-h12345678-s0.csv.gz") - len("+0-more")) + "+0-more"
    assert readable(["lookahead@stock", "greedy@stream", "lookahead@stream"], 0) == "lookahead+greedy"


def test_a_source_sized_by_its_old_key_is_refused_with_the_new_spelling() -> None:
    """``suffix: 4`` (an alias once) is refused, saying ``sources: {suffix: 4}``."""
    with pytest.raises(ConfigError, match=re.escape("decoders[0].suffix: not a key; size the suffix draft source "
                                                    "with sources: {suffix: 4}")):
        to_settings(compose_config("experiment=mtbench", "decoders=[{use:lookahead,suffix:4}]"))
    with pytest.raises(ConfigError, match=re.escape("decoding.recycle: not a key; size the recycle draft source "
                                                    "with sources: {recycle: 2} (on the command line: "
                                                    "+decoding.sources.recycle=2)")):
        to_settings(compose_config("experiment=mtbench", "decoding=lookahead", "+decoding.recycle=2"))
    with pytest.raises(ConfigError, match=re.escape("decoding.suffix: not a key")):
        to_settings(compose_config("experiment=mtbench", "decoders=[lookahead,tree]", "+decoding.suffix=2"))
    sized = to_settings(compose_config("experiment=mtbench", "decoding=lookahead", "+decoding.sources.recycle=2"))
    assert sized.candidates[0].config.sources == (("recycle", 2),)


def test_an_option_adds_its_sources_to_those_of_the_option_it_extends() -> None:
    """``medusa_tree`` extends ``tree``: its ``sources: {medusa: 8}`` joins tree's suffix and recycle
    sources, in a decoders list as under ``decoding=``; so does a list entry's."""
    listed = to_settings(compose_config("experiment=mtbench", "decoders=[medusa_tree,{use:tree,sources:{medusa:3}}]"))
    assert [dict(d.config.sources) for d in listed.candidates] == [{"medusa": 8, "recycle": 4, "suffix": 4},
                                                                   {"medusa": 3, "recycle": 4, "suffix": 4}]
    alone = to_settings(compose_config("experiment=mtbench", "decoding=medusa_tree"))
    assert alone.candidates[0].config == listed.candidates[0].config


def test_the_joblib_launcher_is_available() -> None:
    cfg = compose_config("hydra/launcher=joblib", hydra=True)
    assert "joblib" in cfg.hydra.launcher._target_.lower()


def test_model_linear_is_refused_where_the_kernel_cannot_run_before_any_model_loads() -> None:
    with pytest.raises(ConfigError, match="model.linear must be auto or stock unless the job runs on the cpu in float32"):
        to_settings(compose_config("model=tiny_llama", "model.linear=stream", "model.dtype=bfloat16"), device="cpu")
    with pytest.raises(ConfigError, match="model.linear must be auto or stock unless .* device cuda"):
        to_settings(compose_config("model=tiny_llama", "model.linear=stream"), device="cuda")
    with pytest.raises(Exception, match="model.linear=fast"):           # not one of auto, stream, stock: at compose
        compose_config("model=tiny_llama", "model.linear=fast")
    assert to_settings(compose_config("model=tiny_llama", "model.linear=stream"), device="cpu").model.linear.value == "stream"
    with pytest.raises(ConfigError, match="model.linear must be auto or stock unless .* device cuda"):
        to_settings(compose_config("model=tiny_llama", "model.linear=both"), device="cuda")


def test_model_linear_both_lists_each_decoder_once_per_kernel_under_the_same_file_tag() -> None:
    """``model.linear=both``: ``<name>@stock`` then ``<name>@stream`` for every decoder, the stock
    greedy the baseline, each stream twin checked against greedy's stream twin; the file keeps the
    decoders' tag and gets a fingerprint of its own; '@' in a user's decoder name is refused."""
    overrides = ("model=tiny_llama", "baseline=greedy", "decoders=[lookahead,auto]")
    one = to_settings(compose_config(*overrides), device="cpu")
    both = to_settings(compose_config(*overrides, "model.linear=both"), device="cpu")
    assert [d.name for d in both.decoders] == ["greedy@stock", "lookahead@stock", "auto@stock",
                                               "greedy@stream", "lookahead@stream", "auto@stream"]
    assert [d.linear for d in both.decoders] == ["stock"] * 3 + ["stream"] * 3 and one.baseline.linear is None
    assert both.config_tag == one.config_tag and both.fingerprint() != one.fingerprint()
    by_name = {d.name: d for d in both.decoders}
    assert {name: both.reference(d).name for name, d in by_name.items()} == {
        "greedy@stock": "greedy@stock", "lookahead@stock": "greedy@stock", "auto@stock": "greedy@stock",
        "greedy@stream": "greedy@stock", "lookahead@stream": "greedy@stream", "auto@stream": "greedy@stream"}
    assert by_name["auto@stock"] is not by_name["auto@stream"] and by_name["auto@stock"].params == by_name["auto@stream"].params
    with pytest.raises(ConfigError, match="model.linear: both cannot serve medusa: Medusa heads hold"):
        to_settings(compose_config("model=tiny_llama", "decoders=[medusa]", "model.linear=both"), device="cpu")
    with pytest.raises(ConfigError, match="decoders: a name may not contain '@'"):
        to_settings(compose_config("model=tiny_llama", "decoders=[{use:lookahead,name:la@fast}]"), device="cpu")


def test_a_committed_result_resumes_under_its_migrated_name() -> None:
    """The scaling sweep's first job (scripts/runs/scaling/sweep.sh, committed under results/scaling,
    gzipped) is found by the command that wrote it, on this project's CPU; the streaming kernel
    (model.linear=auto) names a file of its own."""
    from lookahead_core.capability import device_name

    linear = "window:2,ngram:3,guess:2"
    decoders = (f"decoders=[{{use:lookahead,name:w2_n3,{linear}}},{{use:lookahead,name:w2_n3_pool,{linear},prompt_pool:true}}"
                f",{{use:lookahead,name:tree_b9_n3,{linear},prompt_pool:true,tree:true,sources:{{suffix:4,recycle:4}},budget:9}}]")
    overrides = ["experiment=mtbench", "model=smollm2_135m", "dataset.limit=20", "dataset.order=spread", "dataset.turns=1",
                 "experiment.max_new_tokens=128", "decoding.temperature=0", "experiment.score=false", "threads=1",
                 "baseline=greedy", decoders, "results_dir=results/scaling"]
    stock = dataclasses.replace(to_settings(compose_config(*overrides, "model.linear=stock"), device="cpu"),
                    device_name=device_name("cpu"))
    committed = repo_root() / "results/scaling/mtbench/smollm2_135m/w2_n3+w2_n3_pool+tree_b9_n3-h04328baf-s0.csv.gz"
    if device_name("cpu") != "Intel(R) Xeon(R) Processor":
        pytest.skip(f"the committed rows name this project's CPU; this one is {device_name('cpu')}")
    assert stock.results_path() == committed and committed.is_file()
    stream = dataclasses.replace(to_settings(compose_config(*overrides, "model.linear=auto"), device="cpu"), device_name=device_name("cpu"))
    assert stream.fingerprint() != stock.fingerprint()


def chosen(*overrides: str) -> RunSettings:
    from experiments.config.settings import chosen_decoders

    return to_settings(chosen_decoders(compose_config(*overrides), overrides))


def test_decoding_on_the_command_line_runs_that_decoder_alone() -> None:
    """The demo experiment lists hf_pld, lookahead and auto; ``decoding=lookahead`` runs lookahead
    (it ran the demo's three before, the user's choice silently lost)."""
    listed = chosen()
    assert [d.name for d in listed.candidates] == ["hf_pld", "lookahead", "auto"]
    alone = chosen("decoding=lookahead")
    assert [d.name for d in alone.candidates] == ["lookahead"]
    assert [d.name for d in chosen("decoding=auto", "experiment=humaneval").candidates] == ["auto"]


def test_a_decoding_value_still_reaches_every_listed_decoder() -> None:
    settings = chosen("decoding.ngram=3")
    assert [d.name for d in settings.candidates] == ["hf_pld", "lookahead", "auto"]
    assert settings.candidates[1].config.ngram == 3


def test_decoding_and_decoders_together_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"^decoding, decoders: name one"):
        chosen("decoding=lookahead", "decoders=[hf_pld,auto]")
    with pytest.raises(ConfigError, match=r"^decoding, decoders"):
        chosen("decoding=auto", "decoders=[auto]")


def test_the_command_line_applies_the_decoding_rule_before_any_model_loads(tmp_path: Path) -> None:
    run = [sys.executable, str(repo_root() / "run.py"), f"results_dir={tmp_path}", "model=tiny_llama"]
    both = subprocess.run([*run, "decoding=lookahead", "decoders=[hf_pld]"], capture_output=True, text=True,
                          timeout=120)
    assert both.returncode == 2 and "decoding, decoders: name one" in both.stderr, both.stderr
    alone = subprocess.run([*run, "decoding=lookahead", "dataset.limit=0"], capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode == 0, alone.stderr
    assert "demo/tiny_llama/" in alone.stdout and "hf_pld" not in alone.stdout and "auto" not in alone.stdout, \
        alone.stdout
