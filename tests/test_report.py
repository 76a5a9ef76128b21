"""Report aggregation on hand-made rows: ROUGE intervals and the paired difference."""

from __future__ import annotations

import numpy as np
import pandas as pd

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
    assert report._throughput(df) == (10 + 30 + 5) / (2.0 + 3.0 + 1.0)
    assert report._throughput(df.iloc[1:3]) == 10.0
