"""The benchmark preset end to end on a tiny model (rows in the harness's schema, table, resume,
calibration, token trees and --every)."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.presets import benchmark
from experiments.reporting import drafts
from lookahead_core.config import linear_twin

from experiments.job import runner
from experiments.rows.schema import COLUMNS
from experiments.data.datasets import repo_root
from lookahead_core import LookaheadConfig
from lookahead_core.config import config_label

from conftest import DATA_ROOT, needs_full_data  # the full data when present, else tests/fixtures/data

ARGS = [
    "--model", "tiny-llama", "--dataset", "mtbench", "--limit", "2", "--max-new-tokens", "12",
    "--configs", "3,3,3", "--pool", "both", "--pool-only", "3,2", "--prompt-lookup", "3", "--threads", "1",
    "--auto", "--predict", "--calibration-prompts", "1", "--calibration-tokens", "8", "--data-root", str(DATA_ROOT),
]  # fmt: skip
DECODERS = ["hf_greedy", "hf_pld_k3", "core_greedy", "la_N3W3G3", "la_N3W3G3_pool", "pool_N3G2", "auto"]


@pytest.fixture(autouse=True, scope="module")
def keep_torch_threads():
    """--threads sets torch's process-wide thread count; give other modules theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    benchmark.main([*ARGS, "--out", str(out)])
    return out


def read_rows(out: Path) -> pd.DataFrame:
    return benchmark.load_rows(out / "rows.csv")


def test_rows_columns_and_lossless(run_dir: Path):
    with open(run_dir / "rows.csv", newline="") as handle:
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
    for name in ("speedup.png", "predicted_vs_measured.png", "latency.csv", "calibration.csv", "rows.auto.json"):
        assert (run_dir / name).stat().st_size > 0


def test_report_with_another_runs_calibration(run_dir: Path, tmp_path: Path):
    """A run of fixed configs is predicted from another run's record: configs that record never ran
    get the oracle prediction (greedy's host time), calibrated ones keep their own figures."""
    record = json.loads((run_dir / "rows.auto.json").read_text())
    record["candidates"] = [c for c in record["candidates"] if c["decoder"] != "la_N3W3G3"]
    external = tmp_path / "other.auto.json"
    external.write_text(json.dumps(record))
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    rows = read_rows(run_dir)
    rows[rows["decoder"] != "auto"].to_csv(fixed / "rows.csv", index=False)
    text = benchmark.write_report(fixed, external)
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


def test_rerun_resumes(run_dir: Path):
    rows = run_dir / "rows.csv"
    before = rows.read_text()
    benchmark.main([*ARGS, "--out", str(run_dir)])
    assert rows.read_text() == before                         # nothing left to do
    lines = before.splitlines(keepends=True)
    rows.write_text("".join(lines[:-1]))                      # the second prompt loses a row
    benchmark.main([*ARGS, "--out", str(run_dir)])
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
    table = benchmark.summarize(df).set_index("decoder")
    assert list(table.index) == ["hf_greedy", "core_greedy"]
    assert table.loc["core_greedy", "speedup_median"] == pytest.approx(1.5)    # ratios 2 and 1
    assert table.loc["core_greedy", "speedup_sum"] == pytest.approx(6.0 / 4.0)
    assert table.loc["core_greedy", "speedup_e2e"] == pytest.approx(8.0 / 6.0)
    assert table.loc["core_greedy", "S"] == pytest.approx(1.0)
    assert table.loc["hf_greedy", "speedup_sum"] == 1.0 and table.loc["core_greedy", "match_hf_greedy"] == 1.0


def test_decoder_entries_and_names_parse():
    entries = benchmark.build_decoders([(5, 7, 7)], "both", [(4, 1)], [10])
    assert [e["name"] for e in entries] == ["hf_pld_k10", "core_greedy", "la_N5W7G7", "la_N5W7G7_pool", "pool_N4G1"]
    la = entries[2]
    assert (la["use"], la["ngram"], la["window"], la["guess"], la["prompt_pool"]) == ("lookahead", 5, 7, 7, False)
    assert benchmark.parse_ints("5,15,15", 3) == (5, 15, 15)
    with pytest.raises(Exception):
        benchmark.parse_ints("5,15", 3)
    with pytest.raises(ValueError):
        benchmark.build_decoders([(5, 7, 7), (5, 7, 7)], "off", [], [])
    tree = benchmark.parse_core("ngram=5,window=7,guess=7,prompt_pool=1,tree=1,budget=40")
    entry = benchmark.build_decoders([], "off", [], [], extra=[tree])[-1]
    assert (entry["use"], entry["name"], entry["tree"], entry["budget"]) == ("lookahead", "la_N5W7G7_pool_tree_k40", True, 40)
    for bad in ("ngram=5,colour=1", "ngram=x", "seed=3"):
        with pytest.raises(argparse.ArgumentTypeError):
            benchmark.parse_core(bad)


def test_entry_names_are_config_labels():
    """The preset names its decoders by config_label, the names they had when built by hand."""
    configs = [(n, w, g) for n in (2, 3, 5) for w in (1, 4, 15) for g in (0, 1, 7)]
    pool_only = [(n, g) for n in (2, 4) for g in (1, 3)]
    names = [e["name"] for e in benchmark.core_decoders(configs, "both", pool_only)]
    assert names == [f"la_N{n}W{w}G{g}" + ("_pool" if pool else "") for n, w, g in configs for pool in (False, True)] \
        + [f"pool_N{n}G{g}" for n, g in pool_only]
    assert names[-1] == config_label(LookaheadConfig(window=1, ngram=4, guess=3, pool_only=True))


def test_goals_come_from_the_goals_file():
    """conf/goals.yaml gives collect's goal columns (in the committed tables' order) and thresholds."""
    assert [g.column for g in benchmark.load_goals(table="goals")] == ["goal_not_slower", "goal_1.3x", "goal_beats_pld"]
    (tree,) = benchmark.load_goals(table="trees")
    assert tree.column == "goal_S_15pct_no_more_fed" and all(g.statement for g in benchmark.load_goals())
    not_slower, fast, beats = benchmark.load_goals(table="goals")
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
    text = benchmark.main(["collect", str(root)])
    assert text is None and (root / "goals.png").is_file()
    goals = pd.read_csv(root / "goals.csv")
    summary = benchmark.summarize(read_rows(run_dir)).set_index("decoder")
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
    table = benchmark.summarize(mixed)
    assert table["decoder"].is_unique and (table["prompts"] == rows["item_id"].nunique()).all()
    assert table.set_index("decoder")["speedup_sum"].equals(benchmark.summarize(rows).set_index("decoder")["speedup_sum"])


def test_linear_twin_keeps_only_the_linear_fields():
    """A tree's twin drops every tree-only field, cost-aware ones included (replacing the budget
    by 0 while step_costs stayed would be refused by LookaheadConfig)."""
    from lookahead_core import LookaheadConfig

    tree = LookaheadConfig(5, 4, 4, prompt_pool=True, tree=True, suffix=2, recycle=2, recycle_window=True,
                           depth=6, budget=24, step_costs=tuple(1.0 + 0.1 * k for k in range(24)), seed=3)
    assert linear_twin(tree) == LookaheadConfig(5, 4, 4, prompt_pool=True, seed=3)


@needs_full_data("mtbench")                 # --every 10 needs questions 81 and 91, ten apart
def test_tree_configs_and_spread_items(tmp_path: Path):
    """--core adds token-tree decoders (acceptance per source in the rows), --every spreads the
    prompts, collect pairs a windowed tree with its linear twin, and a rows.csv from before the
    draft_acceptance column resumes."""
    out = tmp_path / "trees"
    args = ["--model", "tiny-llama", "--dataset", "mtbench", "--limit", "2", "--every", "10", "--max-new-tokens", "10",
            "--configs", "3,3,3", "--pool", "on", "--pool-only", "--prompt-lookup", "--threads", "1",
            "--core", "ngram=3,guess=2,pool_only=1,tree=1,suffix=2,recycle=2,budget=4",
            "ngram=3,window=3,guess=3,prompt_pool=1,tree=1,suffix=2,recycle=2,recycle_window=1,budget=12",
            "--data-root", str(DATA_ROOT), "--out", str(out)]
    benchmark.main(args)
    df = read_rows(out)
    assert sorted(df["item_id"].unique()) == ["81", "91"]            # questions 81 and 91: two categories
    tree = df[df["decoder"] == "pool_N3G2_tree_sfx2_rc2_k4"]
    assert len(tree) == 2 and tree["matches_greedy"].all()
    assert json.loads(tree["params"].iloc[0])["recycle"] == 2           # every LookaheadConfig field in params
    assert {"suffix", "recycle"} & {r["source"] for r in json.loads(tree["draft_acceptance"].iloc[0])}
    table = benchmark.summarize(df).set_index("decoder")
    assert table.loc["pool_N3G2_tree_sfx2_rc2_k4", "label"] == "pool_N3G2_tree_sfx2_rc2_k4"
    pairs = benchmark.tree_vs_linear(benchmark.load_runs(tmp_path))                      # the windowed tree (recycle_window too) beside its linear twin
    assert pairs[["linear", "tree"]].values.tolist() == [["la_N3W3G3_pool", "la_N3W3G3_pool_tree_sfx2_rc2_rw_k12"]]
    assert pairs["S_tree"].iloc[0] == table.loc["la_N3W3G3_pool_tree_sfx2_rc2_rw_k12", "S"]
    # The tree's rows moved to a folder of their own (same items): still paired with the twin.
    (tmp_path / "tree_only").mkdir()
    df[df["decoder"].isin(["hf_greedy", "la_N3W3G3_pool_tree_sfx2_rc2_rw_k12"])].to_csv(tmp_path / "tree_only" / "rows.csv", index=False)
    df[df["decoder"] != "la_N3W3G3_pool_tree_sfx2_rc2_rw_k12"].to_csv(tmp_path / "linear_only.csv", index=False)
    (tmp_path / "linear_only").mkdir()
    (tmp_path / "linear_only.csv").rename(tmp_path / "linear_only" / "rows.csv")
    split = benchmark.tree_vs_linear(benchmark.load_runs(tmp_path)).set_index("tree_run")
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
    assert "Token trees against linear branches" in benchmark.write_collection(tmp_path)
    assert (tmp_path / "trees.md").is_file()
    # An older file (without draft_acceptance) is rewritten with today's columns and resumed.
    pd.read_csv(out / "rows.csv", dtype=str, keep_default_na=False).drop(columns="draft_acceptance").to_csv(
        out / "rows.csv", index=False)
    benchmark.main(args)
    with open(out / "rows.csv", newline="") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS
    assert len(read_rows(out)) == len(df)
    with pytest.raises(SystemExit):
        benchmark.main([*args[:-2], "--every", "0", "--out", str(out)])


def test_old_benchmark_rows_are_upgraded_to_the_one_schema(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("upgrade", repo_root() / "scripts" / "upgrade_benchmark_rows.py")
    upgrade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(upgrade)
    old_columns = ["model", "dataset", "item_id", "decoder", "family", "N", "W", "G", "prompt_pool", "pool_only",
                   "prompt_lookup", "threads", "max_new_tokens", "new_tokens", "forwards", "steps", "decode_s",
                   "wall_s", "tokens_per_s", "overhead_frac", "step_tokens_mean", "core_decode_s",
                   "matches_hf_greedy", "matches_core_greedy"]
    values = {"hf_greedy": ("hf", "", "", "", "", "", "", 4.0), "hf_pld_k3": ("hf", "", "", "", "", "", "3", 2.0),
              "la_N3W4G4": ("core", "3", "4", "4", "False", "False", "", 8.0)}
    (tmp_path / "run").mkdir()
    rows = tmp_path / "run" / "rows.csv"
    records = [("m", "d", item, name, *v[:7], "1", "8", "9", "6", "5", v[7], v[7] + 1, 9 / v[7], "0.1", "1.0",
                v[7], "True", "True") for item in ("1", "2") for name, v in values.items()]
    pd.DataFrame(records, columns=old_columns).to_csv(rows, index=False)
    assert upgrade.upgrade(rows) and not upgrade.upgrade(rows)
    table = benchmark.summarize(read_rows(rows.parent)).set_index("decoder")
    assert table.loc["hf_pld_k3", "speedup_sum"] == pytest.approx(2.0)
    assert table.loc["la_N3W4G4", "speedup_sum"] == pytest.approx(0.5)
    assert table.loc["la_N3W4G4", "label"] == "la_N3W4G4" and table.loc["la_N3W4G4", "match_hf_greedy"] == 1.0


def test_profile_runs_through_the_harness_job(tmp_path: Path):
    benchmark.main(["profile", "--model", "tiny-llama", "--dataset", "mtbench", "--limit", "1", "--max-new-tokens",
                    "8", "--configs", "3,3,3", "--pool", "on", "--pool-only", "3,1", "--threads", "1",
                    "--data-root", str(DATA_ROOT), "--out", str(tmp_path)])
    table = pd.read_csv(tmp_path / "profile.csv").set_index("decoder")
    assert list(table.index) == ["core_greedy", "la_N3W3G3_pool", "pool_N3G1"]
    assert (table["steps"] > 0).all() and ((table["overhead_frac"] > 0) & (table["overhead_frac"] < 1)).all()


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
