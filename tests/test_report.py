"""Report aggregation on hand-made rows: ROUGE intervals and the paired difference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.reporting import report
from experiments.rows.schema import COLUMNS


def rows(shift: float, n: int = 60, seed: int = 0) -> pd.DataFrame:
    """n items, a sampling baseline and a lookahead decoder whose ROUGE-1 is the baseline's + shift."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.1, 0.3, n)
    noise = rng.normal(0.0, 0.01, n)
    records = []
    for i in range(n):
        for baseline, value in ((True, base[i]), (False, base[i] + shift + noise[i])):
            record = dict.fromkeys(COLUMNS)
            record.update(experiment="cnndm", dataset="cnndm", item_id=str(i), turn=1, model="m", dtype="float32",
                          device="cpu", decoder="sampling" if baseline else "lookahead", baseline=baseline,
                          config="lookahead_x", settings="h1", seed=0, max_new_tokens=64, new_tokens=10, steps=8,
                          S=1.25, decode_s=1.0 if baseline else 2.0, overhead_frac=0.01,
                          rouge1=value, rouge2=value / 4, rougeL=value * 0.7, passed=None)
            records.append(record)
    df = pd.DataFrame(records, columns=COLUMNS)
    df["matches_greedy"] = pd.array([None] * len(df), dtype="boolean")
    df["passed"] = pd.array([None] * len(df), dtype="boolean")
    df["baseline"] = df["baseline"].astype("boolean")
    return df


def test_rouge_intervals_bracket_the_means() -> None:
    row = report.summarize(rows(0.0)).iloc[0]
    for kind in ("rouge1", "rouge2", "rougeL"):
        assert row[f"{kind}_lo"] < row[kind] < row[f"{kind}_hi"]
        assert row[f"{kind}_base_lo"] < row[f"{kind}_base"] < row[f"{kind}_base_hi"]
    assert row["rouge1_diff_lo"] < 0 < row["rouge1_diff_hi"], "equal decoders must have a difference CI around 0"
    assert row["speedup"] == 0.5


def test_a_real_difference_is_detected_by_the_paired_interval() -> None:
    row = report.summarize(rows(0.02)).iloc[0]
    assert 0 < row["rouge1_diff_lo"] < 0.02 < row["rouge1_diff_hi"]
    # The unpaired intervals overlap although the paired one excludes 0: pairing is what resolves it.
    assert row["rouge1_lo"] < row["rouge1_base_hi"]


def test_rouge_table_formats_mean_and_interval() -> None:
    table = report.rouge_table(report.summarize(rows(0.0)))
    assert list(table["ROUGE"]) == ["rouge1", "rouge2", "rougeL"]
    assert table["decoder"].str.fullmatch(r"0\.\d{3} \[0\.\d{3}, 0\.\d{3}\]").all()
    assert table["difference"].str.contains(r"\[-0\.\d{3}, 0\.\d{3}\]").all()


def test_one_summary_groups_by_any_keys_against_any_decoder() -> None:
    df = rows(0.0, n=4).assign(batch_size=1, batch=None, batch_new_tokens=None, wall_s=1.0, tokens_per_s=5.0,
                               step_tokens_mean=1.0)
    table = report.summarize(df, by=["dataset"], with_baseline=True)
    assert list(table.decoder) == ["sampling", "lookahead"] and list(table.dataset) == ["cnndm", "cnndm"]
    assert "speedup" not in table.iloc[0] or pd.isna(table.iloc[0]["speedup"])   # the baseline on itself
    assert table.iloc[1]["speedup"] == 0.5 and table.iloc[1]["calls"] == 4 and table.iloc[1]["call_decode_s"] == 8.0
    assert table.iloc[1]["throughput"] == 40 / 8.0 and table.iloc[1]["S_mean"] == 1.25
    against = report.summarize(df, baseline="lookahead")   # the flagged baseline tested against another
    assert list(against.decoder) == ["sampling"] and against.iloc[0]["speedup"] == 2.0


def test_throughput_counts_each_call_once_whatever_the_batch_sizes_in_the_file() -> None:
    # One call of one sequence (batch_size 1, batch 1: 10 tokens in 2 s), then a call of two
    # sequences that is also "batch 1" (batch_size 2: 30 tokens in 3 s), and a row from before the
    # batch columns (5 tokens in 1 s).
    df = pd.DataFrame([
        {"batch_size": 1, "batch": 1, "turn": 1, "seed": 0, "new_tokens": 10, "batch_new_tokens": 10, "decode_s": 2.0},
        {"batch_size": 2, "batch": 1, "turn": 1, "seed": 0, "new_tokens": 12, "batch_new_tokens": 30, "decode_s": 3.0},
        {"batch_size": 2, "batch": 1, "turn": 1, "seed": 0, "new_tokens": 18, "batch_new_tokens": 30, "decode_s": 3.0},
        {"batch_size": None, "batch": None, "turn": 1, "seed": 0, "new_tokens": 5, "batch_new_tokens": None,
         "decode_s": 1.0},
    ])
    calls = report._calls(df)
    assert len(calls) == 3 and calls["batch_new_tokens"].sum() == 10 + 30 + 5 and calls["decode_s"].sum() == 6.0
    calls = report._calls(df.iloc[1:3])
    assert calls["batch_new_tokens"].sum() / calls["decode_s"].sum() == 10.0


def specbench_rows() -> pd.DataFrame:
    """Three Spec-Bench items, a greedy baseline and lookahead: translation items 161 and 162 (one
    turn each) and the MT-Bench writing item 81 (two turns). (new_tokens, wall_s) per turn:

    item, turn   greedy        lookahead
    161, 1       100, 10 s     100, 5 s
    162, 1        10,  2 s      10, 0.5 s
     81, 1        50,  5 s      50, 2 s
     81, 2        30,  5 s      30, 3 s
    """
    table = [("161", "translation", 1, (100, 10.0), (100, 5.0)), ("162", "translation", 1, (10, 2.0), (10, 0.5)),
             ("81", "writing", 1, (50, 5.0), (50, 2.0)), ("81", "writing", 2, (30, 5.0), (30, 3.0))]
    records = []
    for item_id, category, turn, greedy, lookahead in table:
        for baseline, (tokens, wall) in ((True, greedy), (False, lookahead)):
            record = dict.fromkeys(COLUMNS)
            record.update(experiment="specbench", dataset="specbench", item_id=item_id, category=category, turn=turn,
                          model="m", dtype="float32", device="cpu", decoder="greedy" if baseline else "lookahead",
                          baseline=baseline, config="la", settings="h1", seed=0, new_tokens=tokens,
                          steps=tokens if baseline else tokens // 2, wall_s=wall, decode_s=wall)
            records.append(record)
    df = pd.DataFrame(records, columns=COLUMNS)
    df["baseline"] = df["baseline"].astype("boolean")
    return df


def test_the_spec_bench_layout_shows_spec_benchs_speedup_beside_ours() -> None:
    """Hand arithmetic. Spec-Bench (evaluation/speed.py): per item tokens/s with its turns pooled,
    mean over items, decoder's mean / baseline's mean. Ours: summed baseline time / summed time.

    Translation: lookahead 100/5 = 20 and 10/0.5 = 20 tok/s (mean 20); greedy 100/10 = 10 and
    10/2 = 5 (mean 7.5): Spec-Bench 20 / 7.5 = 2.6667x; ours (10 + 2) / (5 + 0.5) = 12 / 5.5 = 2.1818x.
    Multi-turn (item 81, turns pooled): lookahead 80 / 5 = 16, greedy 80 / 10 = 8: Spec-Bench 2x
    (a per-turn mean would give (25 + 10) / 2 / ((10 + 6) / 2) = 2.1875x); ours 10 / 5 = 2x.
    Overall: lookahead (20 + 20 + 16) / 3 = 56 / 3, greedy (10 + 5 + 8) / 3 = 23 / 3: 56 / 23 =
    2.4348x; ours (10 + 2 + 5 + 5) / (5 + 0.5 + 2 + 3) = 22 / 10.5 = 2.0952x.
    Accepted tokens per step: (99 + 9 + 49 + 29) / (50 + 5 + 25 + 15) = 186 / 95."""
    table = report.leaderboard(specbench_rows())
    assert list(table.columns) == ["decoder", "speedup", "Multi-turn Conversation", "Translation", "Summarization",
                                   "Question Answering", "Mathematical Reasoning", "Retrieval-aug. Generation",
                                   "#Mean Accepted Tokens", "Overall"]
    spec, ours, items, turns = (row for _, row in table.iterrows())
    assert (spec["decoder"], spec["speedup"]) == ("lookahead", report.SPEC_BENCH_SPEEDUP)
    assert (ours["decoder"], ours["speedup"]) == ("lookahead", report.SUMMED_TIME_SPEEDUP)
    assert spec["Translation"] == pytest.approx(20 / 7.5) and ours["Translation"] == pytest.approx(12 / 5.5)
    assert spec["Multi-turn Conversation"] == pytest.approx(2.0) and ours["Multi-turn Conversation"] == pytest.approx(2.0)
    assert spec["Overall"] == pytest.approx(56 / 23) and ours["Overall"] == pytest.approx(22 / 10.5)
    assert spec["#Mean Accepted Tokens"] == ours["#Mean Accepted Tokens"] == pytest.approx(186 / 95)
    assert pd.isna(spec["Summarization"]) and pd.isna(ours["Summarization"])
    assert (items["decoder"], items["Translation"], items["Multi-turn Conversation"], items["Overall"]) == \
        ("items per column", 2, 1, 3)
    assert (turns["decoder"], turns["Translation"], turns["Multi-turn Conversation"], turns["Overall"]) == \
        ("turns per column", 2, 2, 4)
    shown = report.leaderboard_markdown(table)
    assert "| lookahead | Spec-Bench: mean tok/s ratio | 2.00x | 2.67x |  |  |  |  | 1.96 | 2.43x |" in shown
    assert "| lookahead | ours: summed time ratio | 2.00x | 2.18x |  |  |  |  | 1.96 | 2.10x |" in shown
    assert "| items per column |  | 1 | 2 | 0 | 0 | 0 | 0 |  | 3 |" in shown
    for label in (report.SPEC_BENCH_SPEEDUP, report.SUMMED_TIME_SPEEDUP):
        assert f"`{label}` = " in report.leaderboard_note()


def test_auto_records_are_found_beside_gzip_rows():
    """Committed rows are ``x.csv.gz``; auto's records beside them are ``x.<decoder>.json`` (the
    report once looked for ``x.csv.<decoder>.json`` and found none)."""
    from experiments.data.datasets import repo_root

    table = report.auto_calibration(report.find_csvs([repo_root() / "results" / "kernels" / "humaneval"]))
    assert sorted(table.decoder) == ["auto@stock", "auto@stock", "auto@stream", "auto@stream"]
    assert (table["calibration_s"] > 0).all() and (table["items"] > 0).all() and (table["decode_s"] > 0).all()


def both_kernels_rows(times: dict[str, tuple[float, float]], items: dict[str, str]) -> pd.DataFrame:
    """A ``model.linear=both`` Spec-Bench job by hand: per item (its category) every decoder twin,
    ``times[name] = (stock decode_s, stream decode_s)``, greedy's stock twin the baseline; auto
    commits 3 tokens a step, the others one."""
    records = []
    for item, category in items.items():
        for name, pair in times.items():
            for kernel, seconds in zip(("stock", "stream"), pair):
                record = dict.fromkeys(COLUMNS)
                steps = 42 if name == "auto" else 127
                record.update(experiment="specbench", dataset="specbench", item_id=item, category=category, turn=1,
                              model="m", dtype="float32", device="cpu", decoder=f"{name}@{kernel}",
                              baseline=(name, kernel) == ("hf_greedy", "stock"), config="c", settings="h1", seed=0,
                              max_new_tokens=128, new_tokens=128, steps=steps, batch_size=1,
                              decode_s=seconds * (2 if category == "rag" else 1))
                records.append(record)
    df = pd.DataFrame(records, columns=COLUMNS)
    df["baseline"] = df["baseline"].astype("boolean")
    return df


def test_each_kernel_compares_its_decoders_with_its_own_greedy_per_spec_bench_task() -> None:
    df = both_kernels_rows({"hf_greedy": (4.0, 3.0), "auto": (5.0, 2.0), "hf_pld": (3.0, 2.5)},
                           {"1": "writing", "2": "roleplay", "3": "qa", "4": "rag"})
    # an item that only some decoders of the stream kernel ran does not count
    df = pd.concat([df, df[(df.item_id == "4") & (df.decoder == "auto@stream")].assign(item_id="5")])
    table = report.same_layers_table(df).set_index(["kernel", "category", "decoder"])
    assert sorted(set(table.index.get_level_values("category"))) == [
        "Multi-turn Conversation", "Question Answering", "Retrieval-aug. Generation", "all"]
    stock, stream = table.loc[("stock", "all", "auto")], table.loc[("stream", "all", "auto")]
    assert stock.vs_greedy == pytest.approx(0.8) and stock.best == "hf_pld" and stock.vs_best == pytest.approx(0.6)
    assert stream.vs_greedy == pytest.approx(1.5) and stream.best == "hf_pld" and stream.vs_best == pytest.approx(1.25)
    assert stream["items"] == 4 and stream.S == pytest.approx(127 / 42)
    assert table.loc[("stream", "Multi-turn Conversation", "hf_pld")]["items"] == 2
    assert table.loc[("stream", "Retrieval-aug. Generation", "hf_pld")].vs_greedy == pytest.approx(1.2)
    assert "hf_greedy" not in set(table.index.get_level_values("decoder"))
    # the kernel table's gap: S against the speedup over the stock greedy
    kernels = report.kernel_table(report.summarize(df)).set_index("decoder")
    assert kernels.at["auto", "gap_stream"] == pytest.approx(127 / 42 - 20 / 10)
    assert kernels.at["auto", "gap_stock"] == pytest.approx(127 / 42 - 20 / 25)


def test_a_job_on_one_kernel_has_no_same_layers_table() -> None:
    assert report.same_layers_table(rows(0.0, n=3)).empty
