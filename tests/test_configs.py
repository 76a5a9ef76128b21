"""Every option of every config group composes and converts to the core's dataclasses; a bad
override fails with a message naming its key, before any model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments import runner, schema
from experiments.datasets import default_data_root, repo_root
from experiments.schema import ConfigError, Decoder, RunSettings, register_configs, to_settings
from lookahead_core import DecodeLimits, LookaheadConfig, SamplingConfig

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
    assert settings.baseline.lookahead is None and settings.baseline.is_baseline
    if settings.auto is not None:  # the candidate's config is chosen when the model is loaded
        assert settings.candidate == Decoder("auto", None) and settings.auto.calibration_items >= 1
    else:
        assert settings.candidate is None or isinstance(settings.candidate.lookahead, LookaheadConfig)
    assert settings.results_path().suffix == ".csv"


@pytest.mark.parametrize("group", ["model", "experiment", "decoding"])
def test_every_option_composes_and_converts(group: str) -> None:
    assert options(group), f"conf/{group} is empty"
    for option in options(group):
        cfg = compose_config(f"{group}={option}")
        check_settings(to_settings(cfg))


def test_the_default_is_the_small_demo() -> None:
    settings = to_settings(compose_config())
    assert (settings.model.name, settings.experiment, settings.dataset.name) == ("smollm2_135m", "demo", "mtbench")
    assert (settings.dataset.limit, settings.dataset.turns, settings.limits.max_new_tokens) == (6, 1, 128)
    assert settings.candidate is not None and settings.candidate.lookahead == LookaheadConfig(5, 4, 5)
    assert settings.config_tag == "lookahead_w5_n4_g5"


@pytest.mark.parametrize("decoding,baseline,candidate,tag", [
    ("greedy", "greedy", None, "greedy"),
    ("sampling", "sampling", None, "sampling_t1_k0_p1"),
    ("lookahead", "greedy", "lookahead", "lookahead_w15_n5_g15"),
    ("lookahead_pool", "greedy", "lookahead_pool", "lookahead_pool_w15_n5_g15"),
    ("pool_only", "greedy", "pool_only", "pool_only_n5_g15"),
    ("lookahead_sampling", "sampling", "lookahead", "lookahead_w15_n5_g15_t1_k0_p1"),
    ("auto", "greedy", "auto", "auto"),
    ("tree", "greedy", "pool_only", "pool_only_n4_g4_tree_sfx4_rc4_d6_k4"),
    ("lookahead_tree", "greedy", "lookahead_pool", "lookahead_pool_w7_n5_g7_tree_sfx4_rc4_d6_k56"),
])
def test_decoders_and_tags(decoding: str, baseline: str, candidate: str | None, tag: str) -> None:
    settings = to_settings(compose_config("experiment=mtbench", f"decoding={decoding}"))
    assert settings.baseline.name == baseline
    assert (settings.candidate.name if settings.candidate else None) == candidate
    assert settings.config_tag == tag


def test_experiments_follow_the_reference_conventions() -> None:
    budgets = {"mtbench": 1024, "humaneval": 512, "classeval": 2048, "cnndm": 1024, "xsum": 1024, "mbpp": 512}
    for experiment, budget in budgets.items():
        settings = to_settings(compose_config(f"experiment={experiment}"))
        assert settings.limits.max_new_tokens == budget
        assert settings.sampling.greedy == (experiment not in ("cnndm", "xsum"))
    assert to_settings(compose_config("experiment=humaneval")).prompt_format.value == "raw"
    assert to_settings(compose_config("experiment=mtbench")).dataset.turns == 2
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
    assert settings.candidate is not None and settings.candidate.lookahead.guess == 7


@pytest.mark.parametrize("override,key", [
    ("decoding.window=abc", "decoding.window"),
    ("decoding.window=0", "window"),
    ("decoding.ngram=1", "ngram"),
    ("decoding.guess=-1", "guess"),
    ("decoding.top_p=0", "top_p"),
    ("model=nonexistent", "model"),
    ("experiment=nope", "experiment"),
    ("model.dtype=float64", "model.dtype"),
    ("model.typo=1", "model.typo"),
    ("experiment.max_new_tokens=0", "max_new_tokens"),
    ("dataset.limit=-1", "dataset.limit"),
    ("dataset.turns=0", "dataset.turns"),
    ("dataset.options.variant=weird", "dataset.options"),
    ("device=gpu", "device"),
    ("repeats=0", "repeats"),
    ("decoding=auto decoding.calibration_items=0", "decoding.calibration_items"),
    ("decoding=auto decoding.calibration_tokens=0", "decoding.calibration_tokens"),
    ("decoding=auto decoding.lookahead=false", "decoding.lookahead"),
    ("decoding=tree decoding.budget=1", "budget"),
    ("decoding=tree decoding.suffix=-1", "suffix"),
])
def test_bad_values_fail_naming_the_key_before_any_model_loads(override: str, key: str) -> None:
    extra = ["experiment=mbpp"] if override.startswith("dataset.options") else []
    with pytest.raises(Exception) as caught:
        runner.run(compose_config(*extra, *override.split()))
    assert not isinstance(caught.value, AssertionError), "the model was loaded before the config was checked"
    assert key in str(caught.value)


@pytest.mark.skipif(not default_data_root().is_dir(), reason="no offline data")
def test_a_prompt_format_the_items_lack_fails_before_any_model_loads(tmp_path: Path) -> None:
    cfg = compose_config("experiment=humaneval", "dataset.prompt_format=chat", f"results_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"dataset\.prompt_format"):
        runner.run(cfg)


def test_paths_resolve_against_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOKAHEAD_DATA_ROOT", raising=False)
    settings = to_settings(compose_config())
    assert settings.data_root == (repo_root() / ".." / "shared" / "data").resolve()
    assert settings.results_path().is_relative_to(repo_root() / "results" / "raw" / "demo" / "smollm2_135m")
    monkeypatch.setenv("LOOKAHEAD_DATA_ROOT", "/elsewhere/data")
    assert to_settings(compose_config()).data_root == Path("/elsewhere/data")


def test_the_results_path_depends_on_settings_not_on_the_subset() -> None:
    path = to_settings(compose_config()).results_path()
    assert to_settings(compose_config("dataset.limit=3", "dataset.offset=2")).results_path() == path
    assert to_settings(compose_config("experiment.max_new_tokens=32")).results_path() != path
    assert to_settings(compose_config("seed=1")).results_path() != path


def test_tree_fields_at_their_defaults_keep_old_results_paths() -> None:
    """Files written before token trees existed keep their names, so their runs still resume."""
    settings = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_pool"))
    fields = schema._lookahead_fields(settings.candidate.lookahead)
    assert "tree" not in fields and "budget" not in fields
    tree = to_settings(compose_config("experiment=mtbench", "decoding=lookahead_pool", "decoding.tree=true"))
    assert tree.results_path() != settings.results_path() and tree.candidate.lookahead.tree


def test_the_joblib_launcher_is_available() -> None:
    cfg = compose_config("hydra/launcher=joblib", hydra=True)
    assert "joblib" in cfg.hydra.launcher._target_.lower()
