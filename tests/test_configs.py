"""Every option of every config group composes and converts to the core's dataclasses; a bad
override fails with one line naming its key, before any model is loaded and before torch is imported."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.job import runner

from experiments.data.datasets import repo_root
from experiments.decoders.registry import DECODERS, SOURCE_ALIASES, AutoDecoder, CoreDecoder, Decoder, HFGenerate
from experiments.config.errors import ConfigError
from experiments.config.settings import RunSettings, decoding_options, load_option, to_settings
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
    and ``drafter`` (where trained drafters come from) and the built-in sources' aliases are the keys
    beside them."""
    keys = {f.name for f in dataclasses.fields(CoreDecoder.Params)}
    assert keys == ({"lookahead", "heads", "drafter", *SOURCE_ALIASES}
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


@pytest.mark.parametrize("decoding,baseline,candidate,tag", [
    ("greedy", "greedy", None, "greedy"),
    ("sampling", "sampling", None, "sampling_t1_k0_p1"),
    ("lookahead", "greedy", "lookahead", "la_N5W15G15"),
    ("lookahead_pool", "greedy", "lookahead_pool", "la_N5W15G15_pool"),
    ("pool_only", "greedy", "pool_only", "pool_N5G15"),
    ("lookahead_sampling", "sampling", "lookahead_sampling", "la_N5W15G15_t1_k0_p1"),
    ("auto", "greedy", "auto", "auto"),
    ("tree", "greedy", "tree", "pool_N4G4_tree_sfx4_rc4_d6_k4"),
    ("lookahead_tree", "greedy", "lookahead_tree", "la_N5W7G7_pool_tree_sfx4_rc4_d6_k56"),
    ("hf_greedy", "greedy", "hf_greedy", "hf_greedy"),
    ("hf_sampling", "sampling", "hf_sampling", "hf_sampling_t1_k0_p1"),
    ("hf_pld", "greedy", "hf_pld", "hf_pld_k3"),
    ("hf_assisted", "greedy", "hf_assisted", "hf_assisted"),
    ("hf_early_exit", "greedy", "hf_early_exit", "hf_early_exit"),
])
def test_decoders_and_tags(decoding: str, baseline: str, candidate: str | None, tag: str) -> None:
    settings = to_settings(compose_config("experiment=mtbench", f"decoding={decoding}"))
    assert settings.baseline.name == baseline
    assert ([d.name for d in settings.candidates] or [None]) == [candidate]
    assert settings.config_tag == tag


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
    ("experiment=mtbench decoding=tree decoding.suffix=-1", "suffix"),
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


def test_a_decoders_fingerprint_is_its_full_params() -> None:
    settings = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_pool"))
    name, kind, params = settings.candidates[0].fingerprint()
    assert params["tree"] is False and params["budget"] == 0 and params["window"] == 15
    tree = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_pool", "decoding.tree=true"))
    assert tree.results_path() != settings.results_path() and tree.candidates[0].config.tree
    assert tree.candidates[0].fingerprint()[2]["tree"] is True
    assert list(params["step_costs"]) == [] and params["recycle_window"] is False
    auto = to_settings(compose_config("experiment=mtbench", "decoding=auto"))
    again = to_settings(compose_config("experiment=mtbench", "decoding=auto", "decoding.recalibrate=true"))
    assert "recalibrate" not in auto.candidates[0].fingerprint()[2]            # how it calibrates, not what
    assert again.results_path() == auto.results_path() and again.candidates[0].params.recalibrate
    longer = to_settings(compose_config("experiment=mtbench", "decoding=auto", "decoding.calibration_tokens=64"))
    assert longer.results_path() != auto.results_path()


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
                f",{{use:lookahead,name:tree_b9_n3,{linear},prompt_pool:true,tree:true,suffix:4,recycle:4,budget:9}}]")
    overrides = ["experiment=mtbench", "model=smollm2_135m", "dataset.limit=20", "dataset.order=spread", "dataset.turns=1",
                 "experiment.max_new_tokens=128", "decoding.temperature=0", "experiment.score=false", "threads=1",
                 "baseline=greedy", decoders, "results_dir=results/scaling"]
    stock = dataclasses.replace(to_settings(compose_config(*overrides, "model.linear=stock"), device="cpu"),
                    device_name=device_name("cpu"))
    committed = repo_root() / "results/scaling/mtbench/smollm2_135m/w2_n3+w2_n3_pool+tree_b9_n3-hebc0920e-s0.csv.gz"
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
