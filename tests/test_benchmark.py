"""A lineup end to end on a tiny model: one run.py job of many decoders (rows in the harness's
schema), its table (experiments/reporting/lineup.py), resume, calibration, token trees, the goals
across folders, dataset.every and the step profiler (experiments/tools/profile.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.config.errors import ConfigError
from experiments.config.schema import register_configs
from experiments.config.settings import plan, to_settings
from experiments.reporting import drafts, lineup, report
from experiments.reporting.lineup import linear_twin
from experiments.rows.store import sidecar

from experiments.job import runner
from experiments.rows.schema import COLUMNS
from experiments.data.datasets import repo_root
from lookahead_core import LookaheadConfig
from experiments.config.labels import config_label

from conftest import DATA_ROOT, needs_full_data  # the full data when present, else tests/fixtures/data

register_configs()
CONF = repo_root() / "conf"
JOB = ["suite=paper", "model=tiny_llama", "experiment=mtbench", "dataset.limit=2", "experiment.max_new_tokens=12",
       "threads=1", "device=cpu", f"data_root={DATA_ROOT}"]
LINEUP = [
    {"use": "hf_pld", "name": "hf_pld_k3", "k": 3},
    {"use": "greedy", "name": "core_greedy"},
    {"use": "lookahead", "name": "la_N3W3G3", "window": 3, "ngram": 3, "guess": 3},
    {"use": "lookahead", "name": "la_N3W3G3_pool", "window": 3, "ngram": 3, "guess": 3, "prompt_pool": True},
    {"use": "pool_only", "name": "pool_N3G2", "window": 1, "ngram": 3, "guess": 2},
    {"use": "auto", "name": "auto", "protocol": "grid", "predict": True, "calibration_items": 1, "calibration_tokens": 8},
]
DECODERS = ["hf_greedy", "hf_pld_k3", "core_greedy", "la_N3W3G3", "la_N3W3G3_pool", "pool_N3G2", "auto"]


def job_config(*overrides: str, decoders: list | None = None, config: str = "config"):
    """The composed config of ``conf/<config>.yaml`` with ``overrides`` (and this ``decoders`` list)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config, overrides=list(overrides))
    if decoders is not None:
        cfg.decoders = decoders
    return cfg


def run(out: Path, *overrides: str, decoders: list | None = LINEUP) -> Path:
    """run.py's job (the lineup's rows under ``out``), then the lineup's table of ``out``."""
    path = runner.run_job(*plan(job_config(*JOB, f"results_dir={out}", *overrides, decoders=decoders)))
    lineup.write_table(out)
    return path


@pytest.fixture(autouse=True, scope="module")
def keep_torch_threads():
    """threads=1 sets torch's process-wide thread count; give other modules theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    run(out)
    return out


def rows_file(out: Path) -> Path:
    (path,) = report.find_csvs([out])        # the job's one results file, <experiment>/<model>/<name>.csv
    return path


def read_rows(out: Path) -> pd.DataFrame:
    return lineup.load_rows(out)


def test_rows_columns_and_lossless(run_dir: Path):
    with open(rows_file(run_dir), newline="") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS      # the harness's one schema
    df = read_rows(run_dir)
    assert len(df) == 2 * len(DECODERS)
    assert sorted(df["decoder"].unique()) == sorted(DECODERS)
    assert df.groupby("item_id")["order"].apply(lambda o: sorted(o) == list(range(len(DECODERS)))).all()
    assert df[df["baseline"]]["decoder"].eq("hf_greedy").all() and df[~df["baseline"]]["matches_greedy"].all()
    assert (df["experiment"] == "mtbench").all() and (df["turn"] == 1).all()
    assert (df["new_tokens"] == 12).all()                    # the tiny model has no EOS
    assert (df["decode_s"] > 0).all() and (df["decode_s"] < df["wall_s"]).all()
    core = df[df["family"] == "core"]
    assert core["accepted_hist"].notna().all() and core["step_tokens_hist"].notna().all()
    greedy = df[df["decoder"].isin(["hf_greedy", "core_greedy"])]
    assert (greedy["steps"] == 11).all() and (greedy["S"] == 1.0).all()


def test_summary_table_and_cost_model_outputs(run_dir: Path):
    text = (run_dir / "summary.md").read_text()
    for name in DECODERS:
        assert f"| {name} |" in text or (name == "auto" and "| auto = " in text)   # auto names its pick
    assert "speedup median" in text and "decoding=auto" in text
    table = pd.read_csv(run_dir / "summary.csv")
    assert {"tok_s_median", "tok_s_q1", "tok_s_q3", "S", "speedup_median", "speedup_sum", "overhead",
            "match_hf_greedy"} <= set(table.columns)
    assert table.set_index("decoder").loc["hf_greedy", "speedup_sum"] == pytest.approx(1.0)
    assert (table["match_hf_greedy"] == 1.0).all()
    pvm = pd.read_csv(run_dir / "predicted_vs_measured.csv")
    assert {"la_N3W3G3", "la_N3W3G3_pool", "pool_N3G2"} <= set(pvm["decoder"])
    assert (pvm[["predicted_calibration", "predicted_oracle_S", "measured"]] > 0).all().all()
    # pool-only steps keep every row's logits: their best cut is never below their oracle-S prediction
    pool = pvm.set_index("decoder").loc["pool_N3G2"]
    assert pool["best_cut"] >= pool["predicted_oracle_S"] - 1e-9
    for name in ("speedup.png", "predicted_vs_measured.png", "latency.csv", "calibration.csv"):
        assert (run_dir / name).stat().st_size > 0
    assert lineup.auto_records(run_dir) == [sidecar(rows_file(run_dir), ".auto.json")]   # beside the rows


def test_report_with_another_runs_calibration(run_dir: Path, tmp_path: Path):
    """A run of fixed configs is predicted from another run's record: configs that record never ran
    get the oracle prediction (greedy's host time), calibrated ones keep their own figures."""
    record = json.loads(lineup.auto_records(run_dir)[0].read_text())
    record["candidates"] = [c for c in record["candidates"] if c["decoder"] != "la_N3W3G3"]
    external = tmp_path / "other.auto.json"
    external.write_text(json.dumps(record))
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    rows = read_rows(run_dir)
    rows[rows["decoder"] != "auto"].to_csv(fixed / "rows.csv", index=False)
    text = lineup.write_table(fixed, external)
    assert f"latency curve and host times of {external}" in text
    assert not (fixed / "calibration.csv").exists()                # the record's own tables stay with it
    pvm = pd.read_csv(fixed / "predicted_vs_measured.csv").set_index("decoder")
    own = pd.read_csv(run_dir / "predicted_vs_measured.csv").set_index("decoder")
    assert set(pvm.index) == {"la_N3W3G3", "la_N3W3G3_pool", "pool_N3G2"}
    assert pvm.loc["la_N3W3G3", "calibration"] == "not run" and pd.isna(pvm.loc["la_N3W3G3", "predicted_calibration"])
    assert pvm.loc["la_N3W3G3", "predicted_oracle_S"] > 0
    for name in ("la_N3W3G3_pool", "pool_N3G2"):
        assert pvm.loc[name, "predicted_oracle_S"] == pytest.approx(own.loc[name, "predicted_oracle_S"])
        assert pvm.loc[name, "predicted_calibration"] == pytest.approx(own.loc[name, "predicted_calibration"])
    # --calibration may name the other run's folder: its one record
    assert f"latency curve and host times of {lineup.auto_records(run_dir)[0]}" in lineup.write_table(fixed, run_dir)


def test_rerun_resumes(run_dir: Path):
    rows = rows_file(run_dir)
    before = rows.read_text()
    run(run_dir)
    assert rows.read_text() == before                         # nothing left to do
    lines = before.splitlines(keepends=True)
    rows.write_text("".join(lines[:-1]))                      # the second prompt loses a row
    run(run_dir)
    df = read_rows(run_dir)
    assert len(df) == 2 * len(DECODERS) and not df.duplicated(["item_id", "decoder"]).any()


def test_summarize_by_hand():
    def row(item, decoder, decode_s, steps, new=5):
        record = dict.fromkeys(COLUMNS)
        record.update(experiment="e", dataset="d", item_id=item, turn=1, seed=0, model="m", device="cpu",
                      dtype="float32", config="c", settings="h", decoder=decoder, baseline=decoder == "hf_greedy",
                      family="hf" if decoder == "hf_greedy" else "core", max_new_tokens=8, new_tokens=new,
                      steps=steps, forwards=steps + 1, tokens_per_s=new / decode_s, decode_s=decode_s,
                      wall_s=decode_s + 1.0, overhead_frac=0.1, matches_greedy=None if decoder == "hf_greedy" else True)
        return record

    df = pd.DataFrame([row("1", "hf_greedy", 4.0, 4), row("2", "hf_greedy", 2.0, 4),
                       row("1", "core_greedy", 2.0, 4), row("2", "core_greedy", 2.0, 4)])
    for column in ("matches_greedy", "baseline", "passed"):
        df[column] = df[column].astype("boolean")
    table = lineup.summarize(df).set_index("decoder")
    assert list(table.index) == ["hf_greedy", "core_greedy"]
    assert table.loc["core_greedy", "speedup_median"] == pytest.approx(1.5)    # ratios 2 and 1
    assert table.loc["core_greedy", "speedup_sum"] == pytest.approx(6.0 / 4.0)
    assert table.loc["core_greedy", "speedup_e2e"] == pytest.approx(8.0 / 6.0)
    assert table.loc["core_greedy", "S"] == pytest.approx(1.0)
    assert table.loc["hf_greedy", "speedup_sum"] == 1.0 and table.loc["core_greedy", "match_hf_greedy"] == 1.0


def test_decoder_entries_and_names_parse():
    """A lineup's entries are run.py's decoders list: each a conf/decoding option with its values,
    checked (a bad key or value, or a name given twice, fails naming it) before any model loads."""
    paper = to_settings(job_config(*JOB))
    assert [d.name for d in paper.decoders][:5] == ["hf_greedy", "hf_pld_k10", "core_greedy", "la_N5W15G15",
                                                   "la_N5W15G15_pool"]
    la = paper.candidates[2].config
    assert (la.ngram, la.window, la.guess, la.prompt_pool) == (5, 15, 15, False)
    assert paper.candidates[0].params.k == 10
    twice = [{"use": "lookahead", "name": "x", "window": 7}, {"use": "lookahead", "name": "x", "window": 5}]
    with pytest.raises(ConfigError, match="names must differ"):
        to_settings(job_config(*JOB, decoders=twice))
    tree = {"use": "lookahead", "ngram": 5, "window": 7, "guess": 7, "prompt_pool": True, "tree": True, "budget": 40}
    (decoder,) = to_settings(job_config(*JOB, decoders=[{**tree, "name": "t"}])).candidates
    assert decoder.config.tree and decoder.config.budget == 40 and config_label(decoder.config) == "la_N5W7G7_pool_tree_k40"
    for bad, key in (({"colour": 1}, "colour"), ({"ngram": "x"}, "ngram"), ({"seed": 3}, "seed")):
        with pytest.raises(ConfigError, match=key):
            to_settings(job_config(*JOB, decoders=[{"use": "lookahead", "name": "bad", **bad}]))


def test_entry_names_are_config_labels():
    """The paper's lineup names its decoders by config_label, the names they had when built by hand."""
    names = [d.name for d in to_settings(job_config(*JOB)).candidates]
    configs = [(5, 15, 15), (5, 7, 7), (4, 5, 5), (3, 4, 4)]
    assert names == ["hf_pld_k10", "core_greedy"] + [f"la_N{n}W{w}G{g}" + ("_pool" if pool else "")
                                                     for n, w, g in configs for pool in (False, True)] + ["pool_N4G1"]
    assert names[-1] == config_label(LookaheadConfig(window=1, ngram=4, guess=1, pool_only=True))


def test_goals_come_from_the_goals_file():
    """conf/goals.yaml gives collect's goal columns (in the committed tables' order) and thresholds."""
    assert [g.column for g in lineup.load_goals(table="goals")] == ["goal_not_slower", "goal_1.3x", "goal_beats_pld"]
    (tree,) = lineup.load_goals(table="trees")
    assert tree.column == "goal_S_15pct_no_more_fed" and all(g.statement for g in lineup.load_goals())
    not_slower, fast, beats = lineup.load_goals(table="goals")
    row = {"dataset": "mbpp", "auto_speedup": 1.2, "pld_speedup": None}
    assert (not_slower.check(row), fast.check(row), beats.check(row)) == (True, False, None)
    row = {"dataset": "mtbench", "auto_speedup": 0.9, "pld_speedup": 0.8}
    assert (not_slower.check(row), fast.check(row), beats.check(row)) == (False, None, True)
    assert tree.check({"dataset": "d", "S_ratio": 1.15, "fed_tree": 9.0, "fed_linear": 9.0})
    assert not tree.check({"dataset": "d", "S_ratio": 1.5, "fed_tree": 10.0, "fed_linear": 9.0})
    assert not tree.check({"dataset": "d", "S_ratio": 1.1, "fed_tree": 5.0, "fed_linear": 9.0})


def test_collect_checks_the_goals_per_run_folder(run_dir: Path, tmp_path: Path):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(run_dir, root / "tiny_mtbench")
    (root / "empty").mkdir()                                  # folders without rows are skipped
    text = lineup.main(["collect", str(root)])
    assert text is None and (root / "goals.png").is_file()
    goals = pd.read_csv(root / "goals.csv")
    summary = lineup.summarize(read_rows(run_dir)).set_index("decoder")
    row = goals.iloc[0]
    assert (row["run"], row["model"], row["dataset"], row["pld"]) == ("tiny_mtbench", "tiny_llama", "mtbench", "hf_pld_k3")
    assert row["auto_speedup"] == pytest.approx(summary.loc["auto", "speedup_sum"])
    assert row["goal_not_slower"] == (row["auto_speedup"] >= 1.0)
    assert row["goal_beats_pld"] == (row["auto_speedup"] > summary.loc["hf_pld_k3", "speedup_sum"])
    assert pd.isna(row["goal_1.3x"])                          # the 1.3x goal is for HumanEval and MBPP


def test_a_run_resumed_by_newer_code_is_still_one_setup(run_dir: Path):
    """Rows a later version of the code appended to a run folder carry another config tag and
    settings hash; the run's summary still has one row per decoder, over every prompt."""
    rows = read_rows(run_dir)
    later = rows["item_id"].isin(rows["item_id"].unique()[1:])
    mixed = rows.assign(settings=rows["settings"].where(~later, "hnewer"),
                        config=rows["config"].where(~later, "newer+tag"))
    table = lineup.summarize(mixed)
    assert table["decoder"].is_unique and (table["prompts"] == rows["item_id"].nunique()).all()
    assert table.set_index("decoder")["speedup_sum"].equals(lineup.summarize(rows).set_index("decoder")["speedup_sum"])


def test_linear_twin_keeps_only_the_linear_fields():
    """A tree's twin drops every tree-only field, cost-aware ones included (replacing the budget
    by 0 while step_costs stayed would be refused by LookaheadConfig)."""
    from lookahead_core import LookaheadConfig

    tree = LookaheadConfig(5, 4, 4, prompt_pool=True, tree=True, sources={"suffix": 2, "recycle": 2}, recycle_window=True,
                           depth=6, budget=24, step_costs=tuple(1.0 + 0.1 * k for k in range(24)), seed=3)
    assert linear_twin(tree) == LookaheadConfig(5, 4, 4, prompt_pool=True, seed=3)


def test_every_takes_every_kth_item_from_the_offset_then_the_limit():
    """dataset.every=K: every K-th item from dataset.offset on, dataset.limit of them; 1 is the
    consecutive range it always was, and 0 is refused before any model loads."""
    _, _, every = plan(job_config(*JOB, "dataset.limit=null"))
    assert len(every) >= 5
    for offset, step, limit in ((0, 2, 2), (1, 2, 2), (0, 3, None), (0, 1, 3), (0, 2, 0)):
        _, _, items = plan(job_config(*JOB, f"dataset.offset={offset}", f"dataset.every={step}",
                                      f"dataset.limit={'null' if limit is None else limit}"))
        assert [i.item_id for i in items] == [i.item_id for i in every[offset::step][:limit]]
    with pytest.raises(ConfigError, match="dataset.every must be >= 1"):
        plan(job_config(*JOB, "dataset.every=0"))


def test_auto_calibrates_apart_from_spread_items_and_an_overlap_is_refused():
    """With dataset.every > 1, auto calibrates on the items right after the first evaluated one;
    calibration items that are evaluated items too are refused before any model loads."""
    auto = {"use": "auto", "name": "auto", "protocol": "grid", "calibration_items": 1}
    settings, _, items = plan(job_config(*JOB, "dataset.every=2", decoders=[auto]))
    assert settings.candidates[0].params.calibration_offset == 1 and len(items) == 2    # items 0 and 2
    assert plan(job_config(*JOB, decoders=[auto]))[0].candidates[0].params.calibration_offset is None
    with pytest.raises(ConfigError, match="calibration items .* include evaluated items"):
        plan(job_config(*JOB, "dataset.every=2", decoders=[{**auto, "calibration_items": 2}]))   # 1, 2: 2 is evaluated
    with pytest.raises(ConfigError, match="calibration_offset=0"):
        plan(job_config(*JOB, decoders=[{**auto, "calibration_offset": 0}]))
    plan(job_config(*JOB, "dataset.every=2", decoders=[{**auto, "calibration_items": 2, "protocol": "online"}]))


@needs_full_data("mtbench")                 # dataset.every=10 needs questions 81 and 91, ten apart
def test_tree_configs_and_spread_items(tmp_path: Path):
    """Token-tree decoders (acceptance per source in the rows), dataset.every spreads the
    prompts, collect pairs a windowed tree with its linear twin, and a results file from before the
    draft_acceptance column resumes."""
    out = tmp_path / "trees"
    trees = [
        {"use": "greedy", "name": "core_greedy"},
        {"use": "lookahead", "name": "la_N3W3G3_pool", "window": 3, "ngram": 3, "guess": 3, "prompt_pool": True},
        {"use": "lookahead", "name": "pool_N3G2_tree_sfx2_rc2_k4", "ngram": 3, "guess": 2, "pool_only": True,
         "tree": True, "sources": {"suffix": 2, "recycle": 2}, "budget": 4},
        {"use": "lookahead", "name": "la_N3W3G3_pool_tree_sfx2_rc2_rw_k12", "ngram": 3, "window": 3, "guess": 3,
         "prompt_pool": True, "tree": True, "sources": {"suffix": 2, "recycle": 2}, "recycle_window": True, "budget": 12},
    ]
    args = (out, "dataset.every=10", "experiment.max_new_tokens=10")
    run(*args, decoders=trees)
    df = read_rows(out)
    assert sorted(df["item_id"].unique()) == ["81", "91"]            # questions 81 and 91: two categories
    tree = df[df["decoder"] == "pool_N3G2_tree_sfx2_rc2_k4"]
    assert len(tree) == 2 and tree["matches_greedy"].all()
    assert dict(json.loads(tree["params"].iloc[0])["sources"])["recycle"] == 2   # every LookaheadConfig field in params
    assert {"suffix", "recycle"} & {r["source"] for r in json.loads(tree["draft_acceptance"].iloc[0])}
    table = lineup.summarize(df).set_index("decoder")
    assert table.loc["pool_N3G2_tree_sfx2_rc2_k4", "label"] == "pool_N3G2_tree_sfx2_rc2_k4"
    pairs = lineup.tree_vs_linear(lineup.load_runs(tmp_path))         # the windowed tree (recycle_window too) beside its linear twin
    assert pairs[["linear", "tree"]].values.tolist() == [["la_N3W3G3_pool", "la_N3W3G3_pool_tree_sfx2_rc2_rw_k12"]]
    assert pairs["S_tree"].iloc[0] == table.loc["la_N3W3G3_pool_tree_sfx2_rc2_rw_k12", "S"]
    # The tree's rows moved to a folder of their own (same items): still paired with the twin.
    (tmp_path / "tree_only").mkdir()
    df[df["decoder"].isin(["hf_greedy", "la_N3W3G3_pool_tree_sfx2_rc2_rw_k12"])].to_csv(tmp_path / "tree_only" / "rows.csv", index=False)
    (tmp_path / "linear_only").mkdir()
    df[df["decoder"] != "la_N3W3G3_pool_tree_sfx2_rc2_rw_k12"].to_csv(tmp_path / "linear_only" / "rows.csv", index=False)
    split = lineup.tree_vs_linear(lineup.load_runs(tmp_path)).set_index("tree_run")
    assert sorted(split.index) == ["tree_only", "trees"]                  # the same tree in two folders: both rows
    assert split.loc["trees", "linear_run"] == "trees"                    # its own folder's twin first
    assert split.loc["tree_only", "linear_run"] == "linear_only"          # else another folder's
    assert split.loc["tree_only", "S_ratio"] == pytest.approx(pairs["S_ratio"].iloc[0])
    assert split["commit"].tolist() == [runner.git_commit(runner.repo_root())] * 2
    (tmp_path / "tree_only" / "rows.csv").unlink()
    (tmp_path / "linear_only" / "rows.csv").unlink()
    assert drafts.draft_acceptance(df)["tried"].sum() > 0
    assert "Draft nodes per source and depth" in (out / "summary.md").read_text()
    reliability = drafts.draft_reliability(df)
    assert {"suffix", "recycle"} <= set(reliability["source"]) and (out / "reliability.png").is_file()
    acceptance = drafts.draft_acceptance(df).groupby("decoder")["tried"].sum()
    for decoder, tried in reliability.groupby("decoder")["tried"].sum().items():   # a node per tag vs per node
        assert 0 < tried <= acceptance[decoder]
    assert "Token trees against linear branches" in lineup.write_collection(tmp_path)
    assert (tmp_path / "trees.md").is_file()
    # An older file (without draft_acceptance) is rewritten with today's columns and resumed.
    rows = rows_file(out)
    pd.read_csv(rows, dtype=str, keep_default_na=False).drop(columns="draft_acceptance").to_csv(rows, index=False)
    run(*args, decoders=trees)
    with open(rows, newline="") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS
    assert len(read_rows(out)) == len(df)


def test_profile_runs_through_the_harness_job(tmp_path: Path):
    from experiments.tools import profile

    cfg = job_config("model=tiny_llama", "experiment=mtbench", "dataset.limit=1", "experiment.max_new_tokens=8",
                     "threads=1", f"data_root={DATA_ROOT}", f"out={tmp_path}", config="profile", decoders=[
                         {"use": "greedy", "name": "core_greedy"}, {"use": "hf_pld", "name": "hf_pld_k3", "k": 3},
                         {"use": "lookahead", "name": "la_N3W3G3_pool", "window": 3, "ngram": 3, "guess": 3,
                          "prompt_pool": True},
                         {"use": "pool_only", "name": "pool_N3G1", "window": 1, "ngram": 3, "guess": 1}])
    profile.profile(plan(cfg), cfg.out)
    table = pd.read_csv(tmp_path / "profile.csv").set_index("decoder")
    assert list(table.index) == ["core_greedy", "la_N3W3G3_pool", "pool_N3G1"]     # core decoders only
    assert (table["steps"] > 0).all() and ((table["overhead_frac"] > 0) & (table["overhead_frac"] < 1)).all()
    assert "tiny_llama, 1 prompt(s) of mtbench, 8 new tokens" in (tmp_path / "profile.md").read_text()


def test_profile_defaults_to_the_paper_lineup_on_short_decodes():
    """conf/profile.yaml: run.py's groups (suite=paper's core decoders), two items, 64 new tokens
    whatever the experiment's budget, on the cpu; ``out`` is required."""
    import experiments.tools.profile  # noqa: F401 - registers profile_schema

    settings, _, items = plan(job_config("model=tiny_llama", "experiment=humaneval", f"data_root={DATA_ROOT}",
                                         "out=x", config="profile"))
    assert [d.name for d in settings.candidates] == [d.name for d in to_settings(job_config(*JOB)).candidates]
    assert (len(items), settings.limits.max_new_tokens, settings.device) == (2, 64, "cpu")
    with pytest.raises(ConfigError, match="out"):
        plan(job_config("model=tiny_llama", config="profile"))


def test_draft_reliability_sums_prompts_weighted_by_nodes_tried(tmp_path: Path):
    rows = [[{"source": "recycle", "bin": 8, "tried": 2, "predicted": 0.85, "observed": 0.5}],
            [{"source": "recycle", "bin": 8, "tried": 6, "predicted": 0.81, "observed": 1.0},
             {"source": "suffix", "bin": 2, "tried": 1, "predicted": 0.2, "observed": 0.0}]]
    df = pd.DataFrame({"decoder": ["tree", "tree"], "draft_reliability": [json.dumps(r) for r in rows]})
    table = drafts.draft_reliability(df).set_index(["source", "bin"])
    assert table.loc[("recycle", 8), "tried"] == 8
    assert table.loc[("recycle", 8), "predicted"] == pytest.approx((2 * 0.85 + 6 * 0.81) / 8)
    assert table.loc[("recycle", 8), "observed"] == pytest.approx((1 + 6) / 8)
    drafts.plot_reliability(drafts.draft_reliability(df), tmp_path / "r.png", "t")
    assert (tmp_path / "r.png").stat().st_size > 0
